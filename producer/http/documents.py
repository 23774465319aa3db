"""The documents API, and captions of any job.

POST /v1/documents (a document: 202 + id), GET /v1/documents/{id} (status), .../audio (the
assembled file), .../captions?format=vtt|srt, POST /v1/documents/{id}:retry (run again what
failed: 202 + status); GET /v1/jobs/{id}/captions?format=vtt|srt (from
the job's piece timings). As for jobs, a `prompt_audio` URI is refused over HTTP.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import PlainTextResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from producer.erasure import erase_document
from producer.http.body import json_body, read_json_object
from producer.http.context import Context, IdempotencyKey
from producer.http.errors import ApiError, erased
from producer.http.jobs import JOB_ID_RE, _status, refuse_prompt_uri
from producer.http.outcomes import failure_error
from producer.http.responses import (
    ERRORS,
    DocumentAccepted,
    DocumentStatusResponse,
    ErasureResponse,
    ErrorResponse,
    Responses,
)
from producer.http.storage_read import document_not_found, stored_response
from shared.audio import CONTENT_TYPES
from shared.captions import CONTENT_TYPES as CAPTION_TYPES
from shared.captions import cues_from_pieces, render
from shared.document_state import DocumentNotFoundError, DocumentResult, load_plan, plan_owner
from shared.documents import DocumentRequest

router = APIRouter(responses=ERRORS)
CaptionFormat = Literal["vtt", "srt"]  # shared.captions.CAPTION_FORMATS
_NOT_READY: Responses = {
    409: {"model": ErrorResponse, "description": "not assembled yet"},
    422: {"model": ErrorResponse, "description": "the document failed or is incomplete"},
}
_CAPTIONS: Responses = {200: {"content": {"text/vtt": {}, "application/x-subrip": {}}}}


def _location(document_id: str) -> str:
    return f"/v1/documents/{document_id}"


async def document_body(request: Request) -> dict[str, Any]:
    """The document as sent: `CosyqClient.submit_document` checks it against DocumentRequest
    (with the deployment's limits) as it splits it, so its errors read like a job's."""
    body = await read_json_object(request)
    refuse_prompt_uri(body)
    return body


@router.post("/v1/documents", status_code=202, openapi_extra=json_body(DocumentRequest))
async def submit_document(
    response: Response,
    context: Context,
    document: Annotated[dict[str, Any], Depends(document_body)],
) -> DocumentAccepted:
    document_id = await run_in_threadpool(context.client.submit_document, document)
    location = _location(document_id)
    response.headers["Location"] = location
    return DocumentAccepted(id=document_id, status="queued", location=location)


async def check_document_owner(
    context: Context, document_id: str, *, change: bool = False
) -> str | None:
    """The document's tenant (None: nobody's). 404 for an id never made, and the same 404 for
    another tenant's document (or one with no tenant recorded): a key reads and cancels only
    its own tenant's documents, and an id never tells another tenant that it exists. An
    operator key reaches any."""
    if not JOB_ID_RE.fullmatch(document_id):
        raise ApiError(404, "no such document", code="document_not_found")
    try:
        # the plan's head first: another tenant's document is refused unread (plan_owner)
        owner = await run_in_threadpool(plan_owner, context.connection, document_id)
        if owner.known and not context.may_read(owner.tenant):
            raise document_not_found(document_id)
        plan = await run_in_threadpool(load_plan, context.connection, document_id)
    except DocumentNotFoundError as e:
        raise ApiError(404, str(e), code="document_not_found") from e
    if not context.may_read(plan.tenant):
        raise document_not_found(document_id)
    if change:
        context.check_may_change(plan.tenant, "document")
    return plan.tenant


async def _document_status(context: Context, document_id: str) -> DocumentStatusResponse:
    return (await _owned_status(context, document_id))[0]


async def _owned_status(
    context: Context, document_id: str
) -> tuple[DocumentStatusResponse, str | None]:
    """The document's status and its tenant (check_document_owner)."""
    owner = await check_document_owner(context, document_id)
    try:
        status = await run_in_threadpool(context.client.document_status, document_id)
    except DocumentNotFoundError as e:
        raise ApiError(404, str(e), code="document_not_found") from e
    return DocumentStatusResponse.model_validate(status.as_json()), owner


@router.get("/v1/documents/{document_id}")
async def document_status(context: Context, document_id: str) -> DocumentStatusResponse:
    return await _document_status(context, document_id)


@router.delete(
    "/v1/documents/{document_id}",
    responses={403: {"model": ErrorResponse, "description": "an operator key: not its own"}},
)
async def cancel_document(
    context: Context,
    document_id: str,
    *,
    erase: bool = False,
    output_key: bool = False,
    idempotency_key: IdempotencyKey = None,
) -> DocumentStatusResponse | ErasureResponse:
    """Cancel the segments not done yet (as DELETE /v1/jobs/{id} each, with its
    `Idempotency-Key`); the document's status after it (`canceled` once nothing runs; done
    segments and an assembly are left alone). `erase=true`: cancel, then erase it now, as
    DELETE /v1/jobs/{id}?erase=true a job."""
    await check_document_owner(context, document_id, change=True)
    if erase:
        client, storage = context.client, context.storage
        try:
            erasure = await erased(
                lambda: erase_document(client, document_id, output_key=output_key, storage=storage)
            )
        except DocumentNotFoundError as e:  # erased meanwhile
            raise document_not_found(document_id) from e
        return ErasureResponse.model_validate(erasure.as_json())
    cancel = functools.partial(context.client.cancel_document, idempotency_key=idempotency_key)
    try:
        await run_in_threadpool(cancel, document_id)
    except DocumentNotFoundError as e:
        raise ApiError(404, str(e), code="document_not_found") from e
    return await _document_status(context, document_id)


@router.post("/v1/documents/{document_id}:retry", status_code=202)
async def retry_document(context: Context, document_id: str) -> DocumentStatusResponse:
    """Run again what failed (as `cosyq document retry`): the failed or lost segments, then
    the assembly; or the assembly alone when it failed. The document's status after it."""
    await check_document_owner(context, document_id)  # another tenant's: 404, nothing redone
    try:
        await run_in_threadpool(context.client.retry_document, document_id)
    except DocumentNotFoundError as e:
        raise ApiError(404, str(e), code="document_not_found") from e
    return await _document_status(context, document_id)


async def _result(context: Context, document_id: str) -> tuple[DocumentResult, str | None]:
    """The assembled document's result and its tenant; 409 or 422 until there is one."""
    status, owner = await _owned_status(context, document_id)
    if status.result is None:
        code = 409 if status.state not in ("failed", "incomplete", "canceled") else 422
        message = status.message or f"document {document_id} is {status.state}"
        raise ApiError(
            code,
            f"{message}; poll {_location(document_id)}",
            code="not_ready" if code == 409 else "document_failed",
            headers={"Location": _location(document_id)},
        )
    return status.result, owner


@router.get(
    "/v1/documents/{document_id}/audio",
    response_class=StreamingResponse,
    responses={200: {"content": {"audio/*": {}}}, **_NOT_READY},
)
async def document_audio(context: Context, document_id: str) -> StreamingResponse:
    result, owner = await _result(context, document_id)
    headers = {"X-Cosyq-Document-Id": document_id}
    media = CONTENT_TYPES[result.format]
    return await stored_response(context, result.uri, media, headers, document_id, owner=owner)


@router.get(
    "/v1/documents/{document_id}/captions",
    response_class=StreamingResponse,
    responses={**_CAPTIONS, **_NOT_READY},
)
async def document_captions(
    context: Context, document_id: str, format: CaptionFormat = "vtt"
) -> StreamingResponse:
    result, owner = await _result(context, document_id)
    uri = result.vtt_uri if format == "vtt" else result.srt_uri
    headers = {"X-Cosyq-Document-Id": document_id}
    media = CAPTION_TYPES[format]
    return await stored_response(context, uri, media, headers, document_id, owner=owner)


@router.get(
    "/v1/jobs/{job_id}/captions",
    response_class=PlainTextResponse,
    responses={**_CAPTIONS, 409: {"model": ErrorResponse, "description": "no captions (yet)"}},
)
async def job_captions(
    request: Request, context: Context, job_id: str, format: CaptionFormat = "vtt"
) -> Response:
    status = await _status(request, context, job_id)
    if status.failure is not None:
        raise failure_error(job_id, status.failure)
    if status.result is None:
        raise ApiError(409, f"job {job_id} is {status.state}: no captions yet", code="not_ready")
    if not status.result.pieces:
        raise ApiError(
            409, f"job {job_id}: its result has no piece timings", code="no_piece_timings"
        )
    text = render(cues_from_pieces(status.result.pieces), format)
    return PlainTextResponse(text, media_type=CAPTION_TYPES[format])
