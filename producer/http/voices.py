"""GET /v1/audio/voices (`default`, the key's tenant's voices and the shared ones), POST
/v1/audio/voices (upload) and DELETE /v1/audio/voices/{name}.

An upload is multipart/form-data with `name`, `file` (the recording) and `transcript`; it goes
through `CosyqClient.add_voice`, so it gets exactly the checks of `cosyq voices add` (name,
readable, >= 16 kHz, length, not silent) before anything is stored, and a worker computes the
profile. The response waits for that job up to COSYQ_HTTP_WAIT_TIMEOUT_S (then 504 + Location).

A key uploads, replaces and deletes its own tenant's voices only. `shared=true` (a form field
on upload, a query parameter on DELETE) names the shared voices, which only an operator key
(COSYQ_OPERATOR_KEYS) may publish, replace or delete: 403 for a tenant key.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from producer.http.body import json_body
from producer.http.context import Context
from producer.http.errors import ApiError
from producer.http.forms import read_form
from producer.http.outcomes import wait_done
from producer.http.responses import ERRORS, ErrorResponse, VoiceAdded, VoiceEntry, VoiceList
from producer.http.speech import DEFAULT_VOICE
from producer.voice_jobs import wait_for_voice

router = APIRouter(responses=ERRORS)
MULTIPART = "multipart/form-data"


class VoiceUpload(BaseModel):
    """The upload's form fields (read by `add_voice`, checked by `CosyqClient.add_voice`)."""

    name: str = Field(description="1-64 letters, digits, '_', '.' or '-'")
    file: bytes = Field(description="the prompt recording (WAV, FLAC, ...; >= 16 kHz)")
    transcript: str = Field("", description="what the recording says")
    shared: bool = Field(False, description="publish a shared voice (an operator key only)")


def check_shared_rights(context: Context, shared: bool) -> None:
    """Shared voices are written by operator keys only (every tenant may use them)."""
    if shared and not context.operator:
        raise ApiError(
            403,
            "shared: only an operator key (COSYQ_OPERATOR_KEYS) publishes, replaces or deletes "
            "shared voices",
            param="shared",
            code="operator_key_required",
            type_="permission_error",
        )


@router.get("/v1/audio/voices", response_model_exclude_unset=True)
async def list_voices(context: Context) -> VoiceList:
    summaries = await run_in_threadpool(context.client.list_voices)
    voices = [VoiceEntry(name=DEFAULT_VOICE, builtin=True)]
    for summary in summaries:
        voices.append(
            VoiceEntry(
                name=summary.name,
                builtin=False,
                shared=summary.shared,
                speech_tokens=summary.speech_tokens,
                source_seconds=summary.source_seconds,
                model_name=summary.model_name,
                created_at=summary.created_at,
            )
        )
    return VoiceList(voices=voices)


def _field(form: Any, name: str) -> str:
    value = form.get(name)
    if value is None or isinstance(value, UploadFile):
        return ""
    return str(value)


@router.post(
    "/v1/audio/voices",
    status_code=201,
    openapi_extra=json_body(VoiceUpload, MULTIPART),
    responses={
        413: {"model": ErrorResponse, "description": "over COSYQ_HTTP_MAX_UPLOAD_BYTES"},
        504: {"model": ErrorResponse, "description": "the profile is still being computed"},
    },
)
async def add_voice(request: Request, context: Context) -> VoiceAdded:
    if not request.headers.get("content-type", "").startswith(MULTIPART):
        raise ApiError(
            400,
            "request: send multipart/form-data with name, file and transcript",
            code="invalid_value",
        )
    form = await read_form(request, max_files=1, max_fields=8)  # text fields: strict
    try:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise ApiError(
                400, "file: required (the prompt recording)", param="file", code="invalid_value"
            )
        name = _field(form, "name")
        if not name:
            raise ApiError(400, "name: required", param="name", code="invalid_value")
        shared = _flag(_field(form, "shared"), "shared")
        check_shared_rights(context, shared)
        audio = await upload.read()
    finally:
        await form.close()
    # Errors name the form field, never the uploader's file name (which is not stored either:
    # the upload's suffix comes from the audio format detected in its bytes).
    transcript = _field(form, "transcript")
    with context.waits.take(context.client.tenant):  # before the upload: a refusal adds nothing
        job_id = await run_in_threadpool(
            lambda: context.client.add_voice(
                name, audio, transcript, filename="file", shared=shared
            )
        )
        request.state.job_id = job_id
        await wait_done(context, job_id, context.settings.http_wait_timeout_s)
    summary = await run_in_threadpool(wait_for_voice, context.client.tracker, job_id, 0.0)
    return VoiceAdded.model_validate({"voice": summary.to_dict(), "job_id": job_id})


def _flag(value: str, name: str) -> bool:
    if value.lower() in ("", "false", "0"):
        return False
    if value.lower() in ("true", "1"):
        return True
    raise ApiError(
        400, f"{name}: true or false, got {value[:20]!r}", param=name, code="invalid_value"
    )


@router.delete(
    "/v1/audio/voices/{name}",
    status_code=204,
    response_class=Response,
    responses={403: {"model": ErrorResponse, "description": "shared=true without an operator key"}},
)
async def remove_voice(context: Context, name: str, shared: bool = False) -> Response:
    """Delete the key's tenant's voice `name` (`shared=true`: the shared one, operator keys
    only) and its uploaded recording; 404 when that owner has no such voice."""
    check_shared_rights(context, shared)
    await run_in_threadpool(lambda: context.client.remove_voice(name, shared=shared))
    return Response(status_code=204)
