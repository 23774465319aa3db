"""Reading a streamed job's audio (`CosyqClient.stream`): blocking XREAD on its Redis Stream.

The stream is read from its first entry, so a reader may start before the job runs (XREAD
blocks on a key that does not exist yet), while it runs, or after it finished (until the
stream expires with the result). Between blocking reads the job is looked at again, so a job
that ended without finishing its stream (its worker died) or whose stream expired gives a
clear error, never an endless wait.

A failed attempt's error entry ends the read only when the job has ended (failed for good):
while it will be retried (queued, scheduled or started again) the reader waits for the next
attempt's chunks and reads them from its first, so one transient failure costs a reader
nothing. A reader that already had chunks of the failed attempt is told that the stream
restarted (its audio would repeat) when the retry's first chunk comes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from producer.tracking import TERMINAL_STATES, JobTracker, failure_of
from shared.audio_stream import AudioChunk, StreamError, parse_entry
from shared.errors import (
    StreamExpiredError,
    StreamFailedError,
    StreamNotRequestedError,
    StreamTimeoutError,
)
from shared.keys import audio_stream_key
from shared.plurals import counted

READ_COUNT = 64  # entries per XREAD reply


@dataclass
class _Seen:
    chunks: int = 0
    seconds: float = 0.0
    attempt: int | None = None

    def describe(self) -> str:
        if not self.chunks:
            return "no chunk arrived"
        return f"{counted(self.chunks, 'chunk')}, {self.seconds:.2f} s of audio arrived"


def read_stream(
    connection: redis.Redis,
    tracker: JobTracker,
    job_id: str,
    *,
    timeout: float,
    block_ms: int,
) -> Iterator[AudioChunk]:
    """Yield the job's chunks in order until the final one. Raises JobNotFoundError,
    StreamNotRequestedError, StreamExpiredError, StreamFailedError or StreamTimeoutError."""
    job = tracker.fetch(job_id)
    request = job.kwargs.get("request") if isinstance(job.kwargs, dict) else None
    if not isinstance(request, dict) or request.get("stream") is not True:
        raise StreamNotRequestedError(
            f"job {job_id} did not ask for a stream (submit it with stream: true)"
        )
    key = audio_stream_key(job_id)
    deadline = time.monotonic() + timeout
    last_id = "0-0"
    seen = _Seen()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            state = tracker.states([job_id])[0] or "gone"
            raise StreamTimeoutError(
                f"stream of job {job_id}: no final chunk after waiting {timeout:g} s; "
                f"{seen.describe()} (job is {state})"
            )
        block = max(1, min(block_ms, int(remaining * 1000)))
        reply: Any = connection.xread({key: last_id}, count=READ_COUNT, block=block)
        if not reply:
            _check_job(connection, tracker, job_id, key, seen)
            continue
        for raw_id, fields in reply[0][1]:
            last_id = raw_id.decode() if isinstance(raw_id, bytes) else str(raw_id)
            entry = parse_entry(last_id, fields)
            if isinstance(entry, StreamError):
                _check_failed_attempt(tracker, job_id, entry, seen)
                continue  # a retry's chunks follow, or the job's end shows at the next wake-up
            _check_order(job_id, entry, seen)
            seen.chunks += 1
            seen.seconds += entry.duration_s
            yield entry
            if entry.final:
                return


def _check_failed_attempt(
    tracker: JobTracker, job_id: str, entry: StreamError, seen: _Seen
) -> None:
    """A failed attempt's error entry: StreamFailedError when the job has ended (no retry
    follows); otherwise nothing, and the reader waits for the retry (or, for a finished job,
    the final entry of the attempt that finished)."""
    job = tracker.fetch(job_id)
    raw_state = job.get_status(refresh=False)
    state = raw_state.value if raw_state is not None else "unknown"
    if state in TERMINAL_STATES and state != "finished":
        raise StreamFailedError(job_id, entry.kind, f"{entry.message} ({seen.describe()})")


def _check_order(job_id: str, chunk: AudioChunk, seen: _Seen) -> None:
    """A retry restarts at seq 0 (its stream was replaced); any other gap means the stream
    was trimmed by MAXLEN before this reader got there."""
    if seen.attempt is not None and chunk.attempt != seen.attempt:
        raise StreamFailedError(
            job_id,
            "transient",
            f"attempt {seen.attempt} stopped after {seen.describe()}; attempt {chunk.attempt} "
            "restarted the stream (read it again)",
        )
    expected = seen.chunks if seen.attempt is not None else 0
    if chunk.seq != expected:
        raise StreamExpiredError(
            f"stream of job {job_id}: chunk {expected} is gone (trimmed at COSYQ_STREAM_MAXLEN "
            f"entries); the first one left is {chunk.seq}"
        )
    seen.attempt = chunk.attempt


def _check_job(
    connection: redis.Redis, tracker: JobTracker, job_id: str, key: str, seen: _Seen
) -> None:
    """After a read that timed out: is there still anything to wait for?"""
    job = tracker.fetch(job_id)  # JobNotFoundError once the job itself expired
    raw_state = job.get_status(refresh=False)
    state = raw_state.value if raw_state is not None else "unknown"
    if state not in TERMINAL_STATES or (state == "finished" and connection.exists(key)):
        return  # still running, or finished with its final entry still to read
    if state == "finished":
        raise StreamExpiredError(
            f"stream of job {job_id} has expired (streams are kept COSYQ_RESULT_TTL_S); "
            "the job finished: fetch its file with `cosyq result`"
        )
    failure = failure_of(job, state)
    raise StreamFailedError(job_id, failure.kind, f"{failure.message} ({seen.describe()})")
