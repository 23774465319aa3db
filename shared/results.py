"""What a finished job returns (`SynthesisResult`) and why a job failed (`JobFailure`).

The worker builds the result and returns `result.model_dump(mode="json")` from the job function;
RQ stores that JSON and the producer parses it back. Unknown fields are ignored when parsing so a
newer worker's result still reads in an older producer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

AudioFormat = Literal["wav", "flac", "ogg", "mp3", "opus"]
AUDIO_FORMATS: tuple[str, ...] = ("wav", "flac", "ogg", "mp3", "opus")
SampleFormat = Literal["pcm16", "float32"]
FailureKind = Literal["invalid_request", "storage", "transient", "worker_died", "internal"]


class StageTimings(BaseModel):
    """Seconds spent in each step of one job; model stages come from the engine."""

    model_config = ConfigDict(extra="ignore")

    queue_wait_s: float = Field(0.0, ge=0)  # enqueued -> started
    frontend_s: float = Field(0.0, ge=0)
    llm_s: float = Field(0.0, ge=0)
    flow_s: float = Field(0.0, ge=0)
    hift_s: float = Field(0.0, ge=0)
    join_s: float = Field(0.0, ge=0)  # the pieces' fades and pauses (assembly)
    encode_s: float = Field(0.0, ge=0)
    store_s: float = Field(0.0, ge=0)
    total_s: float = Field(0.0, ge=0)  # started -> result returned
    first_chunk_s: float | None = Field(None, ge=0)  # started -> first streamed chunk (stream)


class ModelInfo(BaseModel):
    """Which weights made the audio."""

    model_config = ConfigDict(extra="ignore")

    name: str
    checkpoint_hash: str


class SynthesisResult(BaseModel):
    """Where the audio went and what it cost; returned by `workers.tasks.synthesize`."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_version: Literal[1] = 1
    job_id: str
    uri: str  # file:///... or s3://bucket/key
    bytes: int = Field(ge=0)
    sha256: str
    format: AudioFormat
    sample_rate: int
    duration_s: float = Field(ge=0)
    timings: StageTimings
    rtf: float = Field(ge=0)  # synthesis seconds / audio seconds
    model: ModelInfo
    backend: str
    device: str
    worker_name: str
    worker_pid: int
    attempt: int = Field(ge=1)
    speech_tokens: int = Field(0, ge=0)
    batch_size: int = Field(1, ge=1)  # the most jobs that shared an LLM step with this one
    idempotency_key: str | None = None
    stream: str | None = None  # the Redis Stream key its chunks went to (requests with stream)
    metadata: dict[str, JsonValue] = Field(default_factory=dict)


@dataclass(frozen=True)
class JobFailure:
    """Why a job has no result: the worker's short reason, or RQ's last exception line."""

    kind: str  # one of FailureKind, or "unknown" when only RQ's exc_info is there
    message: str

    def as_meta(self) -> dict[str, str]:
        """The value the worker stores in job.meta["cosyq_error"]."""
        return {"kind": self.kind, "message": self.message}

    @classmethod
    def from_meta(cls, value: Any) -> JobFailure | None:
        """Parse job.meta["cosyq_error"]; None when absent or malformed."""
        if isinstance(value, dict) and isinstance(value.get("message"), str):
            return cls(kind=str(value.get("kind", "internal")), message=value["message"])
        return None
