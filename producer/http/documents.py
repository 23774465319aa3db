"""The documents API, and captions of any job.

POST /v1/documents (a document: 202 + id), GET /v1/documents/{id} (status), .../audio (the
assembled file), .../captions?format=vtt|srt; GET /v1/jobs/{id}/captions?format=vtt|srt (from
the job's piece timings). As for jobs, a `prompt_audio` URI is refused over HTTP.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from producer.http.body import read_json_object
from producer.http.context import context_of
from producer.http.errors import ApiError
from producer.http.jobs import JOB_ID_RE, _status, refuse_prompt_uri
from producer.http.outcomes import failure_error
from producer.http.storage_read import stored_response
from shared.audio import CONTENT_TYPES
from shared.captions import CAPTION_FORMATS, cues_from_pieces, render
from shared.captions import CONTENT_TYPES as CAPTION_TYPES
from shared.document_state import DocumentNotFoundError, DocumentResult

router = APIRouter()


def _location(document_id: str) -> str:
    return f"/v1/documents/{document_id}"


def _caption_format(value: str) -> str:
    if value not in CAPTION_FORMATS:
        raise ApiError(400, "format: vtt or srt", param="format", code="invalid_value")
    return value


@router.post("/v1/documents", status_code=202)
async def submit_document(request: Request) -> JSONResponse:
    context = context_of(request)
    body = await read_json_object(request)
    refuse_prompt_uri(body)
    document_id = await run_in_threadpool(context.client.submit_document, body)
    location = _location(document_id)
    return JSONResponse(
        {"id": document_id, "status": "queued", "location": location},
        status_code=202,
        headers={"Location": location},
    )


async def _document_status(request: Request, document_id: str) -> dict[str, Any]:
    if not JOB_ID_RE.fullmatch(document_id):
        raise ApiError(404, "no such document", code="document_not_found")
    try:
        status = await run_in_threadpool(context_of(request).client.document_status, document_id)
    except DocumentNotFoundError as e:
        raise ApiError(404, str(e), code="document_not_found") from e
    return status.as_json()


@router.get("/v1/documents/{document_id}")
async def document_status(request: Request, document_id: str) -> JSONResponse:
    return JSONResponse(await _document_status(request, document_id))


async def _result(request: Request, document_id: str) -> DocumentResult:
    status = await _document_status(request, document_id)
    if status["result"] is None:
        code = 409 if status["state"] not in ("failed", "incomplete") else 422
        message = status["message"] or f"document {document_id} is {status['state']}"
        raise ApiError(
            code,
            f"{message}; poll {_location(document_id)}",
            code="not_ready" if code == 409 else "document_failed",
            headers={"Location": _location(document_id)},
        )
    return DocumentResult.model_validate(status["result"])


@router.get("/v1/documents/{document_id}/audio")
async def document_audio(request: Request, document_id: str) -> StreamingResponse:
    result = await _result(request, document_id)
    headers = {"X-Cosyq-Document-Id": document_id}
    media = CONTENT_TYPES[result.format]
    return await stored_response(context_of(request), result.uri, media, headers, document_id)


@router.get("/v1/documents/{document_id}/captions")
async def document_captions(
    request: Request, document_id: str, format: str = "vtt"
) -> StreamingResponse:
    fmt = _caption_format(format)
    result = await _result(request, document_id)
    uri = result.vtt_uri if fmt == "vtt" else result.srt_uri
    headers = {"X-Cosyq-Document-Id": document_id}
    return await stored_response(context_of(request), uri, CAPTION_TYPES[fmt], headers, document_id)


@router.get("/v1/jobs/{job_id}/captions")
async def job_captions(request: Request, job_id: str, format: str = "vtt") -> Response:
    fmt = _caption_format(format)
    status = await _status(request, job_id)
    if status.failure is not None:
        raise failure_error(job_id, status.failure)
    if status.result is None:
        raise ApiError(409, f"job {job_id} is {status.state}: no captions yet", code="not_ready")
    if not status.result.pieces:
        raise ApiError(
            409, f"job {job_id}: its result has no piece timings", code="no_piece_timings"
        )
    text = render(cues_from_pieces(status.result.pieces), fmt)
    return PlainTextResponse(text, media_type=CAPTION_TYPES[fmt])
