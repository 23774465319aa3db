"""GET /v1/audio/voices (the registered voices and `default`) and POST /v1/audio/voices (upload).

An upload is multipart/form-data with `name`, `file` (the recording) and `transcript`; it goes
through `CosyqClient.add_voice`, so it gets exactly the checks of `cosyq voices add` (name,
readable, >= 16 kHz, length, not silent) before anything is stored, and a worker computes the
profile. The response waits for that job up to COSYQ_HTTP_WAIT_TIMEOUT_S (then 504 + Location).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
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


@router.get("/v1/audio/voices", response_model_exclude_unset=True)
async def list_voices(context: Context) -> VoiceList:
    summaries = await run_in_threadpool(context.client.list_voices)
    voices = [VoiceEntry(name=DEFAULT_VOICE, builtin=True)]
    for summary in summaries:
        voices.append(
            VoiceEntry(
                name=summary.name,
                builtin=False,
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
        audio = await upload.read()
    finally:
        await form.close()
    # Errors name the form field, never the uploader's file name (which is not stored either:
    # the upload's suffix comes from the audio format detected in its bytes).
    job_id = await run_in_threadpool(
        lambda: context.client.add_voice(name, audio, _field(form, "transcript"), filename="file")
    )
    request.state.job_id = job_id
    await wait_done(context, job_id, context.settings.http_wait_timeout_s)
    summary = await run_in_threadpool(wait_for_voice, context.client.tracker, job_id, 0.0)
    return VoiceAdded.model_validate({"voice": summary.to_dict(), "job_id": job_id})
