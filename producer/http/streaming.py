"""Relaying a job's audio stream (the Redis Stream `cosyq:audio:<job id>`) over HTTP.

A streaming worker appends entries `seq`, `attempt`, `sample_rate`, `pcm` (mono int16
little-endian) and `final` (0/1); an attempt's final entry holds the stored file's `uri`, or, for
a failed attempt, `error_kind` and `error_message` (shared/audio_stream.py). The relay reads it
with blocking XREAD from the first entry, so it works whether it starts before, during or after
the job runs, and re-reads the job's state at least every second, so a job whose worker died
(no entry will come) ends the relay too.

Two shapes: raw audio with chunked transfer (PCM, or a WAV header with open-ended sizes and
then PCM), or OpenAI's server-sent events (`speech.audio.delta` with base64 audio, then
`speech.audio.done`). The first entry is awaited before the response starts, so a job that
fails or times out before any audio still gets a proper status; after that a failure can only
cut the chunked body short (the client sees an incomplete read, never a clean end), or, for
SSE, end the events with an `error` event and no `speech.audio.done`.

`seq` is checked: an attempt's entries must come as 0, 1, 2, ... A reader that fell behind a
`COSYQ_STREAM_MAXLEN` trim (its next entry is gone) is told so (410 `stream_trimmed` before any
audio, an incomplete body or an error event after), never given a clean end with audio missing.
"""

from __future__ import annotations

import base64
import json
import struct
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi.responses import StreamingResponse
from rq.job import Job

from producer.http.context import WAKE_EVERY_S, FrontContext
from producer.http.errors import SERVER_ERROR, ApiError
from producer.http.outcomes import failure_error, job_location
from producer.http.waits import Held
from producer.tracking import TERMINAL_STATES
from shared import audio_stream
from shared.keys import audio_stream_key
from shared.results import JobFailure

STREAM_READ_COUNT = 64
TRIMMED_KIND = "stream_trimmed"  # entries gone before the relay read them (MAXLEN)


@dataclass(frozen=True)
class StreamEntry:
    seq: int
    sample_rate: int
    pcm: bytes
    final: bool
    attempt: int = 1


class StreamFailed(Exception):
    def __init__(self, failure: JobFailure, attempt: int = 1) -> None:
        super().__init__(failure.message)
        self.failure = failure
        self.attempt = attempt


class StreamTimeout(Exception):
    pass


def parse_entry(entry_id: Any, fields: dict[bytes, bytes]) -> StreamEntry:
    """One stream entry (shared.audio_stream's format); StreamFailed for the final entry of a
    failed attempt or a malformed entry."""
    ident = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    try:
        parsed = audio_stream.parse_entry(ident, fields)
    except ValueError as e:
        raise StreamFailed(JobFailure(kind="internal", message=str(e))) from e
    if isinstance(parsed, audio_stream.StreamError):
        raise StreamFailed(JobFailure(kind=parsed.kind, message=parsed.message), parsed.attempt)
    return StreamEntry(
        seq=parsed.seq,
        sample_rate=parsed.sample_rate,
        pcm=parsed.pcm,
        final=parsed.final,
        attempt=parsed.attempt,
    )


async def entries(
    context: FrontContext, job_id: str, timeout: float, held: Held
) -> AsyncIterator[StreamEntry]:
    """`_entries`, released from `held` (its request's wait, producer/http/waits.py) once it
    ends, fails or is abandoned (the client went away)."""
    with held:
        async for entry in _entries(context, job_id, timeout):
            yield entry


async def _entries(
    context: FrontContext, job_id: str, timeout: float
) -> AsyncIterator[StreamEntry]:
    """Every entry of one attempt, from the first to the final one.

    A failed attempt before any audio was yielded is skipped while the job will be retried (its
    state is not terminal), and reported once it is; after audio was yielded it ends the relay
    (StreamFailed), as does a new attempt (its audio would repeat what was sent). StreamTimeout
    when `timeout` seconds pass with no new entry.
    """
    key = audio_stream_key(job_id)
    last_id: Any = b"0-0"
    quiet_since = time.monotonic()
    relayed_attempt: int | None = None
    expected_seq = 0  # the relayed attempt's next entry
    pending: StreamFailed | None = None  # a failed attempt that may be retried
    while True:
        left = timeout - (time.monotonic() - quiet_since)
        if left <= 0:
            raise StreamTimeout(f"no audio from job {job_id} for {timeout:g} s")
        block_ms = max(1, int(1000 * min(left, WAKE_EVERY_S)))
        replies: Any = await context.aredis.xread(
            {key: last_id}, block=block_ms, count=STREAM_READ_COUNT
        )
        if not replies:
            await _check_still_running(context, job_id, pending)
            continue
        for _, items in replies:
            for entry_id, fields in items:
                last_id = entry_id
                try:
                    entry = parse_entry(entry_id, fields)
                except StreamFailed as failed:
                    if relayed_attempt is not None or await _job_ended(context, job_id):
                        raise
                    pending = failed
                    continue
                if relayed_attempt is not None and entry.attempt != relayed_attempt:
                    message = f"attempt {relayed_attempt} was cut short; the job restarted"
                    raise StreamFailed(JobFailure(kind="transient", message=message))
                _check_seq(entry, 0 if relayed_attempt is None else expected_seq)
                relayed_attempt, pending, expected_seq = entry.attempt, None, entry.seq + 1
                yield entry
                if entry.final:
                    return
        quiet_since = time.monotonic()


def _check_seq(entry: StreamEntry, expected: int) -> None:
    """StreamFailed (stream_trimmed) when entries before this one are gone."""
    if entry.seq != expected:
        message = (
            f"chunk {expected} of attempt {entry.attempt} is gone (trimmed at "
            f"COSYQ_STREAM_MAXLEN entries before this reader got to it); the next left is "
            f"{entry.seq}: fetch the stored file when the job finished"
        )
        raise StreamFailed(JobFailure(kind=TRIMMED_KIND, message=message), entry.attempt)


async def _state(context: FrontContext, job_id: str) -> str | None:
    raw: Any = await context.aredis.hget(Job.key_for(job_id), "status")
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)


async def _job_ended(context: FrontContext, job_id: str) -> bool:
    return (await _state(context, job_id)) in TERMINAL_STATES


async def _check_still_running(
    context: FrontContext, job_id: str, pending: StreamFailed | None
) -> None:
    state = await _state(context, job_id)
    if state is None:
        raise StreamFailed(JobFailure(kind="not_found", message="the job expired"))
    if state in TERMINAL_STATES:
        if pending is not None:  # its failed attempt was the last one
            raise pending
        # Ended, yet no final entry after a full wake-up: the stream expired or was never made.
        if not await context.aredis.exists(audio_stream_key(job_id)):
            message = f"job is {state} and its audio stream is gone (expired)"
        else:
            message = f"job is {state} but its stream has no final entry"
        raise StreamFailed(JobFailure(kind="stream_ended", message=message))


def streaming_wav_header(sample_rate: int) -> bytes:
    """A PCM16 mono WAV header for a stream of unknown length (sizes 0xFFFFFFFF)."""
    unknown = 0xFFFFFFFF
    return (
        b"RIFF"
        + struct.pack("<I", unknown)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", unknown)
    )


def _error_for(job_id: str, error: Exception) -> ApiError:
    if isinstance(error, StreamFailed):
        if error.failure.kind == "not_found":
            return ApiError(
                404, f"no job {job_id} (never submitted, or expired)", code="job_not_found"
            )
        if error.failure.kind in ("stream_ended", TRIMMED_KIND):
            code = "stream_gone" if error.failure.kind == "stream_ended" else TRIMMED_KIND
            return ApiError(
                410, f"job {job_id}: {error.failure.message}", code=code, extra={"job_id": job_id}
            )
        return failure_error(job_id, error.failure)
    return ApiError(
        504,
        f"{error}; poll {job_location(job_id)}",
        type_=SERVER_ERROR,
        code="timeout",
        headers={"Location": job_location(job_id)},
        extra={"job_id": job_id},
    )


async def relay_response(
    context: FrontContext, job_id: str, stream_format: str, wav_header: bool, held: Held
) -> StreamingResponse:
    """The job's stream as a chunked response (raw audio or SSE), once its first entry is in;
    `held` (the request's wait) is released when the relay ends."""
    timeout = context.settings.http_wait_timeout_s
    source = entries(context, job_id, timeout, held)
    try:
        first = await anext(source)
    except (StreamFailed, StreamTimeout) as e:
        raise _error_for(job_id, e) from e
    except StopAsyncIteration as e:  # pragma: no cover - entries() always yields or raises
        raise ApiError(500, "empty stream", type_=SERVER_ERROR) from e

    async def audio() -> AsyncIterator[bytes]:
        if wav_header:
            yield streaming_wav_header(first.sample_rate)
        yield first.pcm
        if not first.final:
            async for entry in source:
                yield entry.pcm

    headers = {"X-Cosyq-Job-Id": job_id, "X-Cosyq-Sample-Rate": str(first.sample_rate)}
    if stream_format == "sse":
        return StreamingResponse(
            _events(job_id, first, source), media_type="text/event-stream", headers=headers
        )
    media_type = "audio/wav" if wav_header else "audio/pcm"
    return StreamingResponse(audio(), media_type=media_type, headers=headers)


async def _events(
    job_id: str, first: StreamEntry, rest: AsyncIterator[StreamEntry]
) -> AsyncIterator[bytes]:
    """OpenAI's SSE: one `speech.audio.delta` per entry with samples, then `speech.audio.done`.
    An entry without samples (the final one usually) sends no delta: an empty delta is noise to
    a client that decodes each one. A failure after the first event (a failed or restarted
    attempt, a gap in `seq`) ends the events with an `error` event and no `done`."""
    if first.pcm:
        yield _sse({"type": "speech.audio.delta", "audio": _b64(first.pcm)})
    if not first.final:
        try:
            async for entry in rest:
                if entry.pcm:
                    yield _sse({"type": "speech.audio.delta", "audio": _b64(entry.pcm)})
        except (StreamFailed, StreamTimeout) as e:
            yield _sse(_error_event(_error_for(job_id, e)))
            return
    yield _sse({"type": "speech.audio.done"})


def _error_event(error: ApiError) -> dict[str, object]:
    """An SSE `error` event with OpenAI's error fields (the stream ends without `done`)."""
    fields = {"message": error.message, "type": error.type, "code": error.code}
    return {"type": "error", "error": fields}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _sse(event: Mapping[str, object]) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()
