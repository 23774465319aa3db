"""The JSON the HTTP front answers with, as models: the routes build them and OpenAPI shows them.

Fields a status leaves out when they do not apply (a job's `result` before it finished, its
`error` unless it failed) are optional here and left out of the JSON (`exclude_unset`), as
`cosyq result` prints them. Each model carries an example from a real answer's shape.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from producer.cancel import CancelVerdict
from shared.document_state import DocumentResult
from shared.results import SynthesisResult

_JOB_ID = "4f6c2a9e0b7d4d1e9a3c5b8f7e6d2c1a"


def _examples(*examples: dict[str, Any]) -> ConfigDict:
    return ConfigDict(json_schema_extra={"examples": list(examples)})


class ApiErrorDetail(BaseModel):
    message: str = Field(description='"field: rule", or what went wrong')
    type: str = Field(description="invalid_request_error, rate_limit_error or server_error")
    param: str | None = Field(description="the request field at fault, when one is")
    code: str | None = Field(description="a stable name: invalid_value, queue_full, ...")


class ErrorResponse(BaseModel):
    """OpenAI's error JSON; some errors add top-level keys (`job_id`, a batch's `submitted`)."""

    model_config = ConfigDict(
        extra="allow",
        json_schema_extra={
            "examples": [
                {
                    "error": {
                        "message": "speed: 9.0 is outside 0.5-2.0",
                        "type": "invalid_request_error",
                        "param": "speed",
                        "code": "invalid_value",
                    }
                }
            ]
        },
    )

    error: ApiErrorDetail
    job_id: str | None = None


class JobAccepted(BaseModel):
    model_config = _examples({"id": _JOB_ID, "status": "queued", "location": f"/v1/jobs/{_JOB_ID}"})

    id: str
    status: Literal["queued"]
    location: str = Field(description="GET it for the job's status (also the Location header)")


class BatchAccepted(BaseModel):
    model_config = _examples({"ids": [_JOB_ID], "status": "queued"})

    ids: list[str] = Field(description="the job ids, in request order")
    status: Literal["queued"]


class JobError(BaseModel):
    kind: str = Field(description="the failure kind: invalid_request, canceled, transient, ...")
    message: str


class JobStatusResponse(BaseModel):
    """A job's status: `result` once finished, `error` once failed."""

    model_config = _examples(
        {
            "job_id": _JOB_ID,
            "state": "queued",
            "queue": "cosyq-default",
            "tenant": "default",
            "enqueued_at": "2026-01-05T10:00:00+00:00",
            "started_at": None,
            "ended_at": None,
            "worker_name": None,
            "submitted": {
                "submitted_at": "2026-01-05T10:00:00+00:00",
                "text_chars": 23,
                "voice": "default",
                "mode": "zero_shot",
                "priority": "default",
                "idempotency_key": None,
            },
        }
    )

    job_id: str
    state: str = Field(description="queued, started, finished, failed, canceled, scheduled, ...")
    queue: str | None
    tenant: str | None = Field(
        description="who submitted it (the API key's tenant); null: no tenant tag (operators "
        "only see such a job)"
    )
    enqueued_at: str | None = Field(description="ISO 8601")
    started_at: str | None
    ended_at: str | None
    worker_name: str | None
    submitted: dict[str, JsonValue] = Field(
        description="what the producer recorded of the request (sizes and names, never text)"
    )
    result: SynthesisResult | None = None
    error: JobError | None = None


class ErasureResponse(BaseModel):
    """What `DELETE ...?erase=true` deleted (producer/erasure.py)."""

    id: str
    kind: Literal["job", "document"]
    erased: bool = True
    deleted: list[str] = Field(description="the stored objects deleted (URIs)")
    kept: list[str] = Field(description="a caller's output_key kept (erase it: output_key=true)")


class CancelResponse(BaseModel):
    model_config = _examples(
        {
            "id": _JOB_ID,
            "result": "canceled",
            "state": "queued",
            "message": f"job {_JOB_ID} canceled (it was queued; it will not run)",
        }
    )

    id: str
    result: CancelVerdict = Field(description="canceled, stopping or already_canceled")
    state: str = Field(description="the state the job was in")
    message: str


class DocumentAccepted(BaseModel):
    model_config = _examples(
        {"id": _JOB_ID, "status": "queued", "location": f"/v1/documents/{_JOB_ID}"}
    )

    id: str
    status: Literal["queued"]
    location: str


class SegmentFailureInfo(BaseModel):
    index: int
    words: str = Field(description="the segment's first words")
    job_id: str | None
    reason: str


class DocumentStatusResponse(BaseModel):
    model_config = _examples(
        {
            "document_id": _JOB_ID,
            "state": "running",
            "segments": 3,
            "queued": 2,
            "running": 1,
            "done": 0,
            "failed": 0,
            "missing": 0,
            "audio_s": 0.0,
            "eta_s": None,
            "failures": [],
            "result": None,
            "message": "",
        }
    )

    document_id: str
    state: str = Field(description="running, failed, canceled, incomplete, assembling, assembled")
    segments: int
    queued: int
    running: int
    done: int
    failed: int
    missing: int = Field(description="jobs or audio gone (expired, deleted)")
    audio_s: float
    eta_s: float | None
    failures: list[SegmentFailureInfo]
    result: DocumentResult | None
    verdict: str | None = Field(
        None, description="suspect when any segment's quality verdict is (None: none checked)"
    )
    verdicts: list[str | None] = Field(
        default_factory=list, description="each segment's quality verdict (None: not done)"
    )
    message: str


class VoiceEntry(BaseModel):
    """A voice in the list: `default` is built in (the model folder's prompt) and has no more."""

    name: str
    builtin: bool
    shared: bool = Field(
        default=False,
        description="an operator's shared voice: every tenant may use it, none change it",
    )
    speech_tokens: int | None = None
    source_seconds: float | None = None
    model_name: str | None = None
    created_at: str | None = None


class VoiceList(BaseModel):
    model_config = _examples(
        {
            "voices": [
                {"name": "default", "builtin": True},
                {
                    "name": "alice",
                    "builtin": False,
                    "speech_tokens": 75,
                    "source_seconds": 3.0,
                    "model_name": "CosyVoice2-0.5B",
                    "created_at": "2026-01-05T10:00:00+00:00",
                },
            ]
        }
    )

    voices: list[VoiceEntry]


class VoiceInfo(BaseModel):
    """A stored voice's summary (shared.voices.VoiceSummary)."""

    name: str
    transcript: str
    speech_tokens: int
    source_sample_rate: int
    source_seconds: float
    model_name: str
    checkpoint_hash: str
    created_at: str
    source_uri: str | None
    format: int
    replaced: bool = Field(description="the name had a voice before, now replaced")
    shared: bool = Field(
        default=False, description="a shared voice (published with an operator key)"
    )


class VoiceAdded(BaseModel):
    voice: VoiceInfo
    job_id: str = Field(description="the job that computed the voice's profile")


Responses = dict[int | str, dict[str, Any]]  # a route's `responses=`, for OpenAPI
ERRORS: Responses = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in (
        (400, "invalid request: the message names the field and the rule"),
        (401, "missing or invalid API key"),
        (404, "no such job, document or voice"),
        (429, "a queue is full (Retry-After)"),
        (503, "Redis or the storage is unreachable"),
    )
}

# Every model above that a route answers with (their examples, published whole).
RESPONSE_MODELS = (
    ErrorResponse,
    JobAccepted,
    BatchAccepted,
    JobStatusResponse,
    CancelResponse,
    DocumentAccepted,
    DocumentStatusResponse,
    VoiceList,
    VoiceAdded,
)
