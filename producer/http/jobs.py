"""The native jobs API: submit `SynthesisRequest`s, read their status, audio and stream.

POST /v1/jobs (one request, 202 + id) and POST /v1/jobs:batch (`{"requests": [...]}`, pipelined
by `CosyqClient.submit_many`: all valid or none enqueued). Prompt audio over HTTP comes only as a
registered voice (`POST /v1/audio/voices` uploads one), so a `prompt_audio` URI is refused: a
`file://` one would make a worker read its own host's files, an `s3://` one any object its
credentials reach.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from rq.job import Job
from starlette.concurrency import run_in_threadpool

from producer.erasure import erase_job
from producer.http.body import json_body, read_json, read_json_object
from producer.http.context import Context, IdempotencyKey
from producer.http.errors import ApiError, erased
from producer.http.outcomes import failure_error, job_location
from producer.http.responses import (
    ERRORS,
    BatchAccepted,
    CancelResponse,
    ErasureResponse,
    ErrorResponse,
    JobAccepted,
    JobStatusResponse,
    Responses,
)
from producer.http.storage_read import audio_response, job_not_found
from producer.http.streaming import relay_response
from producer.tracking import JobStatus, status_record, tenant_of_job
from producer.tracking import job_status as status_of
from shared.errors import QueueFullError
from shared.jobs import SynthesisRequest, validate_request
from shared.keys import JOB_ID_RE, JOB_ID_RULE, SYNTHESIZE_FUNCTION

router = APIRouter(responses=ERRORS)
_AUDIO: Responses = {200: {"content": {"audio/*": {}}, "description": "the stored audio file"}}
_NOT_READY: Responses = {
    409: {"model": ErrorResponse, "description": "no audio: not finished, or canceled"}
}


class BatchRequest(BaseModel):
    """`{"requests": [...]}`: each a SynthesisRequest, all valid or none enqueued.

    The items are checked by `CosyqClient.submit_many`, so an error names its index
    ("requests[3]: text: ...") like every producer's."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"requests": [{"text": "First sentence."}, {"text": "Second.", "format": "mp3"}]}
            ]
        },
    )

    requests: list[SynthesisRequest] = Field(min_length=1)


def refuse_prompt_uri(raw: Any, where: str = "") -> None:
    if isinstance(raw, Mapping) and raw.get("prompt_audio") is not None:
        uri = str(raw["prompt_audio"])
        reason = (
            "a file:// URI would be read from the worker's own disk"
            if uri.startswith("file:")
            else "a URI is not accepted here"
        )
        raise ApiError(
            400,
            f"{where}prompt_audio: {reason}; over HTTP, upload the recording as a voice "
            "(POST /v1/audio/voices) and name it in `voice`",
            param="prompt_audio",
            code="prompt_uri_refused",
        )


def checked_job_id(job_id: str) -> str:
    if not JOB_ID_RE.fullmatch(job_id):
        raise ApiError(404, f"no such job (a job id is {JOB_ID_RULE})", code="job_not_found")
    return job_id


async def job_body(request: Request, context: Context) -> SynthesisRequest:
    """The body as a SynthesisRequest, checked with this deployment's limits (in a thread: a
    hostile body's check, its 60,000 metadata items walked or its unknown fields named, took
    ~0.5 s of Python, and on the event loop every tenant's requests waited for it)."""
    body = await read_json_object(request)
    refuse_prompt_uri(body)
    # its errors: "field: rule"
    return await run_in_threadpool(validate_request, body, context.client.limits)


async def batch_body(request: Request, context: Context) -> list[Any]:
    """The batch's requests, not yet checked (see BatchRequest), within COSYQ_HTTP_MAX_BATCH."""
    body = await read_json(request)
    requests = body.get("requests") if isinstance(body, dict) else None
    if not isinstance(requests, list) or not requests:
        raise ApiError(
            400,
            'requests: send {"requests": [<SynthesisRequest>, ...]}, at least one',
            param="requests",
            code="invalid_value",
        )
    limit = context.settings.http_max_batch
    if len(requests) > limit:
        raise ApiError(
            400,
            f"requests: {len(requests):,} requests, limit {limit:,} (COSYQ_HTTP_MAX_BATCH)",
            param="requests",
            code="invalid_value",
        )
    for index, raw in enumerate(requests):
        refuse_prompt_uri(raw, where=f"requests[{index}]: ")
    return requests


@router.post("/v1/jobs", status_code=202, openapi_extra=json_body(SynthesisRequest))
async def submit_job(
    request: Request,
    response: Response,
    context: Context,
    job: Annotated[SynthesisRequest, Depends(job_body)],
) -> JobAccepted:
    job_id = await run_in_threadpool(context.client.submit, job)
    request.state.job_id = job_id
    response.headers["Location"] = job_location(job_id)
    return JobAccepted(id=job_id, status="queued", location=job_location(job_id))


@router.post("/v1/jobs:batch", status_code=202, openapi_extra=json_body(BatchRequest))
async def submit_batch(
    context: Context, requests: Annotated[list[Any], Depends(batch_body)]
) -> BatchAccepted:
    try:
        job_ids = await run_in_threadpool(context.client.submit_many, requests)
    except QueueFullError as e:
        raise ApiError(
            429,
            f"queue full: {e}",
            type_="rate_limit_error",
            code="queue_full",
            headers={"Retry-After": str(context.settings.http_retry_after_s)},
            extra={"submitted": list(e.submitted)},
        ) from e
    return BatchAccepted(ids=job_ids, status="queued")


def check_owner(context: Context, job_id: str, tenant: str | None) -> None:
    """A job of another tenant answers as no such job: a key reads, streams and cancels only
    its own tenant's jobs, and an id never tells another tenant that it exists. A job without
    a tenant tag belongs to nobody (an operator key reads any)."""
    if not context.may_read(tenant):
        raise job_not_found(job_id)


async def owned_job(request: Request, context: Context, job_id: str) -> Job:
    """The job, once its owner is checked: 404 for an id never submitted and the same 404 for
    another tenant's job, the same Redis read before either (one script that reads the hash
    only for its owner: another's answers nil, as an unknown id's), nothing of the job read
    past its tenant tag (its hash, its result, its failure), so no answer, no byte from Redis
    and no time taken tells another tenant that the id exists."""
    request.state.job_id = checked_job_id(job_id)
    tracker, tenant = context.client.tracker, context.client.tenant
    job = await run_in_threadpool(
        lambda: tracker.fetch_owned(job_id, tenant, operator=context.operator)
    )
    check_owner(context, job_id, tenant_of_job(job))
    return job


async def _status(request: Request, context: Context, job_id: str) -> JobStatus:
    job = await owned_job(request, context, job_id)
    return await run_in_threadpool(status_of, job)


@router.get("/v1/jobs/{job_id}", response_model_exclude_unset=True)
async def job_status(request: Request, context: Context, job_id: str) -> JobStatusResponse:
    status = await _status(request, context, job_id)
    return JobStatusResponse.model_validate(status_record(status))


@router.delete(
    "/v1/jobs/{job_id}",
    responses={
        403: {"model": ErrorResponse, "description": "an operator key: another tenant's job"},
        409: {"model": ErrorResponse, "description": "ended (cancel); still stopping (erase)"},
    },
)
async def cancel_job(
    request: Request,
    context: Context,
    job_id: str,
    *,
    erase: bool = False,
    output_key: bool = False,
    idempotency_key: IdempotencyKey = None,
) -> CancelResponse | ErasureResponse:
    """Cancel: 200 with what happened (`canceled`, `stopping`, `already_canceled`), 409 when the
    job already finished or failed (nothing changed), 404 for no such job. A retry with the
    first try's `Idempotency-Key` answers as the first did (never `already_canceled`).
    `erase=true`: cancel it if need be, then erase it now (producer/erasure.py;
    `output_key=true` deletes a caller's output_key too): 200 with what was deleted, 409
    `still_running` while it stops."""
    status = await _status(request, context, job_id)  # 404: no such job, or another tenant's
    context.check_may_change(status.tenant, "job")
    if erase:
        client, storage = context.client, context.storage
        erasure = await erased(
            lambda: erase_job(client, job_id, output_key=output_key, storage=storage)
        )
        return ErasureResponse.model_validate(erasure.as_json())
    cancel = functools.partial(context.client.cancel, idempotency_key=idempotency_key)
    outcome = await run_in_threadpool(cancel, job_id)
    body = {"id": job_id, "result": outcome.verdict, "state": outcome.state}
    if outcome.verdict == "already_ended":
        raise ApiError(409, outcome.describe(), code="already_ended", extra=body)
    return CancelResponse(
        id=job_id, result=outcome.verdict, state=outcome.state, message=outcome.describe()
    )


@router.get("/v1/jobs/{job_id}/audio", response_class=Response, responses={**_AUDIO, **_NOT_READY})
async def job_audio(request: Request, context: Context, job_id: str) -> Response:
    status = await _status(request, context, job_id)
    if status.failure is not None:
        raise failure_error(job_id, status.failure)
    if status.result is None:
        raise ApiError(
            409,
            f"job {job_id} is {status.state}: no audio yet; poll {job_location(job_id)}",
            code="not_ready",
            headers={"Location": job_location(job_id)},
            extra={"job_id": job_id},
        )
    return await audio_response(context, status.result, status.tenant)


@router.get(
    "/v1/jobs/{job_id}/stream",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"audio/pcm": {}, "audio/wav": {}, "text/event-stream": {}},
            "description": "the audio as it is made (raw, or OpenAI's speech.audio.* events)",
        }
    },
)
async def job_stream(
    request: Request,
    context: Context,
    job_id: str,
    format: Literal["pcm", "wav"] = "pcm",
    stream_format: Literal["audio", "sse"] = "audio",
) -> StreamingResponse:
    job = await owned_job(request, context, job_id)
    request_doc = job.kwargs.get("request") if job.func_name == SYNTHESIZE_FUNCTION else None
    if not isinstance(request_doc, dict) or not request_doc.get("stream"):
        raise ApiError(
            400,
            f'job {job_id} did not ask for a stream (submit it with "stream": true)',
            param="job_id",
            code="not_streamed",
        )
    held = context.waits.take(context.client.tenant)
    return await relay_response(context, job_id, stream_format, format == "wav", held)
