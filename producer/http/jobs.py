"""The native jobs API: submit `SynthesisRequest`s, read their status, audio and stream.

POST /v1/jobs (one request, 202 + id) and POST /v1/jobs:batch (`{"requests": [...]}`, pipelined
by `CosyqClient.submit_many`: all valid or none enqueued). Prompt audio over HTTP comes only as a
registered voice (`POST /v1/audio/voices` uploads one), so a `prompt_audio` URI is refused: a
`file://` one would make a worker read its own host's files, an `s3://` one any object its
credentials reach.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from producer.commands.inspect import status_record
from producer.http.body import read_json, read_json_object
from producer.http.context import context_of
from producer.http.errors import ApiError
from producer.http.outcomes import failure_error, job_location
from producer.http.storage_read import audio_response
from producer.http.streaming import relay_response
from producer.tracking import JobStatus
from shared.errors import QueueFullError
from shared.jobs import validate_request
from shared.keys import JOB_ID_RE, JOB_ID_RULE, SYNTHESIZE_FUNCTION

router = APIRouter()


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


def _accepted(job_ids: list[str]) -> dict[str, Any]:
    return {"id": job_ids[0], "status": "queued", "location": job_location(job_ids[0])}


@router.post("/v1/jobs", status_code=202)
async def submit_job(request: Request) -> JSONResponse:
    context = context_of(request)
    body = await read_json_object(request)
    refuse_prompt_uri(body)
    checked = validate_request(body, context.client.limits)  # its errors: "field: rule"
    job_id = await run_in_threadpool(context.client.submit, checked)
    request.state.job_id = job_id
    return JSONResponse(
        _accepted([job_id]), status_code=202, headers={"Location": job_location(job_id)}
    )


@router.post("/v1/jobs:batch", status_code=202)
async def submit_batch(request: Request) -> JSONResponse:
    context = context_of(request)
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
    return JSONResponse({"ids": job_ids, "status": "queued"}, status_code=202)


async def _status(request: Request, job_id: str) -> JobStatus:
    context = context_of(request)
    request.state.job_id = checked_job_id(job_id)
    return await run_in_threadpool(context.client.status, job_id)


@router.get("/v1/jobs/{job_id}")
async def job_status(request: Request, job_id: str) -> JSONResponse:
    status = await _status(request, job_id)
    return JSONResponse(status_record(status))


@router.delete("/v1/jobs/{job_id}")
async def cancel_job(request: Request, job_id: str) -> JSONResponse:
    """Cancel: 200 with what happened (`canceled`, `stopping`, `already_canceled`), 409 when the
    job already finished or failed (nothing changed), 404 for no such job."""
    context = context_of(request)
    request.state.job_id = checked_job_id(job_id)
    outcome = await run_in_threadpool(context.client.cancel, job_id)
    body = {"id": job_id, "result": outcome.verdict, "state": outcome.state}
    if outcome.verdict == "already_ended":
        raise ApiError(409, outcome.describe(), code="already_ended", extra=body)
    return JSONResponse({**body, "message": outcome.describe()})


@router.get("/v1/jobs/{job_id}/audio")
async def job_audio(request: Request, job_id: str) -> Response:
    status = await _status(request, job_id)
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
    return await audio_response(context_of(request), status.result)


@router.get("/v1/jobs/{job_id}/stream")
async def job_stream(
    request: Request, job_id: str, format: str = "pcm", stream_format: str = "audio"
) -> StreamingResponse:
    context = context_of(request)
    request.state.job_id = checked_job_id(job_id)
    if format not in ("pcm", "wav") or stream_format not in ("audio", "sse"):
        raise ApiError(
            400,
            "format: pcm or wav; stream_format: audio or sse",
            param="format",
            code="invalid_value",
        )
    job = await run_in_threadpool(context.client.tracker.fetch, job_id)
    request_doc = job.kwargs.get("request") if job.func_name == SYNTHESIZE_FUNCTION else None
    if not isinstance(request_doc, dict) or not request_doc.get("stream"):
        raise ApiError(
            400,
            f'job {job_id} did not ask for a stream (submit it with "stream": true)',
            param="job_id",
            code="not_streamed",
        )
    return await relay_response(context, job_id, stream_format, format == "wav")
