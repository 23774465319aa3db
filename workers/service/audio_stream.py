"""The worker's side of a streamed job: appends the engine's chunks to `cosyq:audio:<job id>`.

The engine emits 24 kHz float chunks; each is resampled by one stateful soxr stream (so the
chunk edges leave no seams), quantized to PCM16 and appended with XADD (MAXLEN bounded, the
result's TTL refreshed). The writer keeps the float samples it sent: the stored file is encoded
from exactly those, so it equals the streamed audio. A retried attempt starts the stream afresh.
"""

from __future__ import annotations

import time
from typing import Any, cast

import numpy as np
import redis

from shared.audio import RESAMPLE_QUALITY
from shared.audio_stream import chunk_fields, error_fields, final_fields, to_pcm16
from shared.jobs import NATIVE_SAMPLE_RATE, SUPPORTED_SAMPLE_RATES
from shared.keys import audio_stream_key
from shared.logs import get_logger

log = get_logger(__name__)
RELEASED_STREAM_TTL_S = 86_400  # a died job's new stream when its job has no result TTL


def end_released_stream(
    connection: redis.Redis,
    job_id: str,
    request: object,
    *,
    kind: str,
    message: str,
    ttl_s: int | None,
) -> bool:
    """The reaper's half: a streamed job whose worker died ends its attempt's stream with the
    error (a reader gets it at once instead of waiting for its timeout). Only when the stream
    exists or the request asked for one; the entry continues the last entry's seq and attempt.
    Kept as long as the stream already was, else `ttl_s` (the job's result TTL). Returns
    whether an entry was written."""
    if not isinstance(request, dict) or request.get("stream") is not True:
        return False
    key = audio_stream_key(job_id)
    rate = request.get("sample_rate", NATIVE_SAMPLE_RATE)
    if not isinstance(rate, int) or rate not in SUPPORTED_SAMPLE_RATES:
        rate = NATIVE_SAMPLE_RATE
    seq, attempt = 0, 1
    last = cast(list, connection.xrevrange(key, count=1))
    if last:
        fields = last[0][1]
        seq, attempt = int(fields[b"seq"]) + 1, int(fields.get(b"attempt", b"1"))
        if fields.get(b"final") == b"1":
            return False  # the attempt ended its stream itself
    ttl = connection.ttl(key)
    pipe = connection.pipeline(transaction=False)
    pipe.xadd(key, error_fields(seq, attempt, rate, kind=kind, message=message))  # type: ignore[arg-type]
    if not (isinstance(ttl, int) and ttl > 0):
        ttl = ttl_s if ttl_s is not None and ttl_s > 0 else RELEASED_STREAM_TTL_S
    pipe.expire(key, ttl)
    pipe.execute()
    return True


class AudioStreamWriter:
    """Appends one attempt's chunks; `first_chunk_at` is the perf_counter of the first XADD."""

    def __init__(
        self,
        connection: redis.Redis,
        key: str,
        *,
        source_rate: int,
        target_rate: int,
        attempt: int,
        maxlen: int,
        ttl_s: int,
    ) -> None:
        self.connection = connection
        self.key = key
        self.source_rate = source_rate
        self.target_rate = target_rate
        self.attempt = attempt
        self.maxlen = maxlen
        self.ttl_s = ttl_s
        self.seq = 0
        self.sent: list[np.ndarray] = []  # float32 at target_rate, in order
        self.chunk_sizes: list[int] = []
        self.first_chunk_at: float | None = None
        self._tail = np.zeros(0, dtype=np.float32)
        self._resampler = (
            None if source_rate == target_rate else _resample_stream(source_rate, target_rate)
        )
        connection.delete(key)  # an earlier attempt's chunks are not this attempt's audio

    def write(self, samples: np.ndarray) -> None:
        """One engine chunk (24 kHz float32) -> one stream entry (when it yields samples)."""
        converted = self._convert(samples, last=False)
        if converted.size:
            pcm = to_pcm16(converted)
            self._append(chunk_fields(self.seq, self.attempt, self.target_rate, pcm))
            self.sent.append(converted)
            self.chunk_sizes.append(int(converted.size))
            self.seq += 1
            if self.first_chunk_at is None:
                self.first_chunk_at = time.perf_counter()

    def flush(self) -> np.ndarray:
        """The resampler's last samples (sent later with the final entry); every sample the
        stream will hold, concatenated, float32 at the target rate."""
        tail = self._convert(np.zeros(0, dtype=np.float32), last=True)
        self._tail = tail
        return np.concatenate([*self.sent, tail]) if self.sent or tail.size else tail

    def finish(self, uri: str) -> None:
        """The final entry: the resampler's tail (maybe empty), the stored file's URI."""
        tail = self._tail
        total = sum(chunk.size for chunk in self.sent) + tail.size
        fields = final_fields(
            self.seq, self.attempt, self.target_rate, to_pcm16(tail), uri=uri, samples=total
        )
        self._append(fields)
        if tail.size:
            self.chunk_sizes.append(int(tail.size))
        if self.first_chunk_at is None:
            self.first_chunk_at = time.perf_counter()
        self.seq += 1

    def fail(self, kind: str, message: str) -> None:
        """The final entry of a failed attempt, so no reader waits forever. Best effort: an
        error writing it (Redis gone) is logged, never raised over the job's own error."""
        try:
            fields = error_fields(
                self.seq, self.attempt, self.target_rate, kind=kind, message=message
            )
            self._append(fields)
        except redis.RedisError as e:
            log.warning("stream_error_entry_lost", stream=self.key, error=str(e))

    def _append(self, fields: dict[str, str | int | bytes]) -> None:
        pipe = self.connection.pipeline(transaction=False)
        pipe.xadd(self.key, fields, maxlen=self.maxlen, approximate=False)  # type: ignore[arg-type]
        pipe.expire(self.key, self.ttl_s)
        pipe.execute()

    def _convert(self, samples: np.ndarray, *, last: bool) -> np.ndarray:
        samples = np.ascontiguousarray(samples, dtype=np.float32)
        if self._resampler is None:
            return samples
        return np.asarray(self._resampler.resample_chunk(samples, last=last), dtype=np.float32)


def _resample_stream(source_rate: int, target_rate: int) -> Any:
    """One stateful soxr stream; soxr is imported here, when a stream's rate differs."""
    import soxr  # noqa: PLC0415 (not at each worker's start)

    return soxr.ResampleStream(source_rate, target_rate, 1, "float32", RESAMPLE_QUALITY)
