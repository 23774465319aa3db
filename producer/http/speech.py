"""POST /v1/audio/speech: OpenAI's request shape, turned into one of our jobs.

`model` is `cosyvoice2` (`tts-1` and `tts-1-hd` are aliases), `input` the text, `voice` a
registered voice or `default`, `response_format` wav/flac/opus/mp3/pcm (OpenAI's default mp3;
pcm is 24 kHz 16-bit little-endian mono with no header, as OpenAI sends it), `speed`, and
`instructions` switch on instruct2; `markup` (ours, default `auto`) is a job's: `plain` reads
every angle bracket of `input` as written. The job is checked by the same `validate_request` as
every producer; its errors are renamed to OpenAI's fields (text -> input, ...).
"""

from __future__ import annotations

import io
from typing import Annotated, Any, Literal

import soundfile as sf
from fastapi import APIRouter, Depends, Request, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from producer.http.body import json_body, parse_body, read_json_object
from producer.http.context import Context
from producer.http.errors import ApiError
from producer.http.outcomes import finished_result
from producer.http.responses import ERRORS, ErrorResponse, Responses
from producer.http.storage_read import check_owned, job_not_found
from producer.http.streaming import relay_response
from shared.audio import CONTENT_TYPES
from shared.errors import InvalidRequestError
from shared.job_text import TextMarkup
from shared.jobs import MAX_SPEED, MIN_SPEED, NATIVE_SAMPLE_RATE, validate_request

router = APIRouter(responses=ERRORS)

MODELS = ("cosyvoice2", "tts-1", "tts-1-hd")
RESPONSE_FORMATS = ("wav", "flac", "opus", "mp3", "pcm")
STREAM_RESPONSE_FORMATS = ("pcm", "wav")
PCM_CONTENT_TYPE = "audio/pcm"
DEFAULT_VOICE = "default"
# The contract's field names -> OpenAI's, in error messages.
_RENAMED = {"text": "input", "instruction": "instructions", "format": "response_format"}


class SpeechRequest(BaseModel):
    """OpenAI's speech request; unknown fields are refused like the contract's."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "model": "cosyvoice2",
                    "input": "Your order has shipped.",
                    "voice": "default",
                    "response_format": "wav",
                },
                {
                    "model": "tts-1",
                    "input": "Streamed as it is made.",
                    "response_format": "pcm",
                    "stream_format": "audio",
                },
            ]
        },
    )

    model: str = Field(json_schema_extra={"enum": list(MODELS)})
    input: str = Field(description="the text (SSML when it starts with <speak>)")
    markup: TextMarkup = Field(  # ours, not OpenAI's (its SDK: extra_body={"markup": "plain"})
        "auto",
        description="auto: markup and SSML read as in a job; plain: every angle bracket as "
        'written ("List<String>", "<b>" are words)',
    )
    voice: str = Field(DEFAULT_VOICE, description="a registered voice (GET /v1/audio/voices)")
    response_format: str = Field("mp3", json_schema_extra={"enum": list(RESPONSE_FORMATS)})
    speed: float = Field(  # checked by the contract (its message); strict: true is not a speed
        1.0, strict=True, json_schema_extra={"minimum": MIN_SPEED, "maximum": MAX_SPEED}
    )
    instructions: str | None = Field(None, description="how to speak: turns on instruct2")
    stream_format: Literal["audio", "sse"] | None = Field(
        None, description="relay the audio as it is made (response_format pcm or wav)"
    )


def parse_speech(body: dict[str, Any]) -> SpeechRequest:
    speech = parse_body(SpeechRequest, body)
    if speech.model not in MODELS:
        raise ApiError(
            400,
            f"model: {speech.model!r} is not served here; use one of {', '.join(MODELS)}",
            param="model",
            code="model_not_found",
        )
    if speech.response_format not in RESPONSE_FORMATS:
        raise ApiError(
            400,
            f"response_format: {speech.response_format} is not supported; "
            f"use one of {', '.join(RESPONSE_FORMATS)}",
            param="response_format",
            code="unsupported_format",
        )
    if speech.stream_format and speech.response_format not in STREAM_RESPONSE_FORMATS:
        raise ApiError(
            400,
            f"response_format: {speech.response_format} cannot be streamed; "
            f"stream_format {speech.stream_format} takes {' or '.join(STREAM_RESPONSE_FORMATS)}",
            param="response_format",
            code="unsupported_format",
        )
    return speech


def job_payload(speech: SpeechRequest) -> dict[str, Any]:
    """The SynthesisRequest fields for an OpenAI request (pcm is made as 24 kHz PCM16 WAV)."""
    payload: dict[str, Any] = {
        "text": speech.input,
        "markup": speech.markup,
        "voice": speech.voice,
        "speed": speech.speed,
        "format": "wav" if speech.response_format == "pcm" else speech.response_format,
        "sample_rate": NATIVE_SAMPLE_RATE,
    }
    if speech.instructions is not None:
        payload.update(mode="instruct2", instruction=speech.instructions)
    if speech.stream_format is not None:
        payload["stream"] = True  # the worker appends chunks to cosyq:audio:<job id>
    return payload


def renamed(message: str) -> str:
    """A contract error as OpenAI field names: "text: must not be empty" -> "input: ..."."""
    parts = []
    for part in message.split("; "):
        field, sep, rule = part.partition(": ")
        parts.append(f"{_RENAMED.get(field, field)}{sep}{rule}" if sep else part)
    return "; ".join(parts)


def pcm_of(wav: bytes) -> bytes:
    """The raw little-endian int16 samples of a PCM16 WAV file."""
    samples, _ = sf.read(io.BytesIO(wav), dtype="int16")
    return bytes(samples.astype("<i2").tobytes())


async def speech_body(request: Request) -> SpeechRequest:
    """Checked in a thread, as a job's body is (jobs.job_body): not on the event loop."""
    return await run_in_threadpool(parse_speech, await read_json_object(request))


_SPEECH_RESPONSES: Responses = {
    200: {
        "content": {media: {} for media in (*CONTENT_TYPES.values(), PCM_CONTENT_TYPE)}
        | {"text/event-stream": {}},
        "description": "the audio in response_format (streamed with stream_format)",
    },
    504: {"model": ErrorResponse, "description": "still running: poll its Location"},
}


@router.post(
    "/v1/audio/speech",
    response_class=Response,
    openapi_extra=json_body(SpeechRequest),
    responses=_SPEECH_RESPONSES,
)
async def create_speech(
    request: Request, context: Context, speech: Annotated[SpeechRequest, Depends(speech_body)]
) -> Response:
    payload = job_payload(speech)
    try:
        checked = await run_in_threadpool(validate_request, payload, context.client.limits)
    except InvalidRequestError as e:
        raise InvalidRequestError(renamed(str(e))) from e
    held = context.waits.take(context.client.tenant)  # before the submit: a refusal queues none
    try:
        # an unknown voice (another tenant's too): the submit's own check, 404 voice_not_found
        job_id = await run_in_threadpool(context.client.submit, checked)
        request.state.job_id = job_id
        if speech.stream_format is not None:  # the relay releases it when it ends
            wav = speech.response_format == "wav"
            return await relay_response(context, job_id, speech.stream_format, wav, held)
        result = await finished_result(context, job_id, context.settings.http_wait_timeout_s)
    except BaseException:
        held.release()
        raise
    held.release()
    check_owned(context, result.uri, context.client.tenant, job_not_found(job_id))
    data = await run_in_threadpool(context.storage.get, result.uri)
    headers = {"X-Cosyq-Job-Id": job_id}
    if speech.response_format == "pcm":
        return Response(pcm_of(data), media_type=PCM_CONTENT_TYPE, headers=headers)
    return Response(data, media_type=CONTENT_TYPES[result.format], headers=headers)
