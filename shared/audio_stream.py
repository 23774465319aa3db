"""The entries of a streamed job's Redis Stream (`cosyq:audio:<job id>`), written by the worker
and read by the producer: one format, defined once.

Every entry has `seq` (0, 1, ... within one attempt), `attempt`, `sample_rate`, `pcm` (mono
int16 little-endian at the request's sample rate; may be empty) and `final` (0/1). The last
entry of an attempt has `final=1` and either the stored file's `uri` (and the total `samples`)
or, for a failed attempt, `error_kind` and `error_message`. Concatenating every entry's `pcm`
gives the stored audio (within PCM16 rounding for formats other than 16-bit WAV).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

PCM_SCALE = 32768.0  # int16 full scale: from_pcm16 maps -32768..32767 to [-1, 1)
INT32_SCALE = 2.0**31  # libsndfile's float -> PCM_16 goes through int32 (see to_pcm16)


def to_pcm16(samples: np.ndarray) -> bytes:
    """Float32 samples -> int16 little-endian bytes, exactly as libsndfile writes PCM_16 WAV
    (so a streamed job's chunks equal its stored 16-bit file sample for sample).

    libsndfile rounds x * 2^31 to the nearest int32 (saturating) and keeps its top 16 bits.
    That is floor(x * 32768) except for small samples a hair below a step, which the int32
    rounding lifts onto it (about one sample in 50,000 of speech): floor alone differed there.
    """
    wide = np.asarray(samples, dtype=np.float64) * INT32_SCALE  # exact: float32 * 2^31
    as_int32 = np.clip(np.rint(wide), -INT32_SCALE, INT32_SCALE - 1)
    return np.floor(as_int32 / 65536.0).astype("<i2").tobytes()


def from_pcm16(pcm: bytes) -> np.ndarray:
    """int16 little-endian bytes -> float32 samples in [-1, 1]."""
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / PCM_SCALE


@dataclass(frozen=True)
class AudioChunk:
    """One entry of a job's audio stream, as the producer yields it."""

    seq: int
    sample_rate: int
    pcm: bytes  # mono int16 little-endian
    final: bool
    attempt: int = 1
    uri: str | None = None  # on the final entry: where the complete file was stored
    entry_id: str = ""  # the Redis Stream entry id

    def samples(self) -> np.ndarray:
        """The chunk's samples as float32 in [-1, 1]."""
        return from_pcm16(self.pcm)

    @property
    def frames(self) -> int:
        return len(self.pcm) // 2

    @property
    def duration_s(self) -> float:
        return self.frames / self.sample_rate if self.sample_rate else 0.0


@dataclass(frozen=True)
class StreamError:
    """The final entry of a failed attempt: the worker's failure kind and short message."""

    seq: int
    attempt: int
    kind: str
    message: str


def chunk_fields(
    seq: int, attempt: int, sample_rate: int, pcm: bytes, *, final: bool = False
) -> dict[str, str | int | bytes]:
    return {
        "seq": seq,
        "attempt": attempt,
        "sample_rate": sample_rate,
        "pcm": pcm,
        "final": int(final),
    }


def final_fields(
    seq: int, attempt: int, sample_rate: int, pcm: bytes, *, uri: str, samples: int
) -> dict[str, str | int | bytes]:
    fields = chunk_fields(seq, attempt, sample_rate, pcm, final=True)
    fields.update(uri=uri, samples=samples)
    return fields


def error_fields(
    seq: int, attempt: int, sample_rate: int, *, kind: str, message: str
) -> dict[str, str | int | bytes]:
    fields = chunk_fields(seq, attempt, sample_rate, b"", final=True)
    fields.update(error_kind=kind, error_message=message)
    return fields


def parse_entry(entry_id: str, fields: Mapping[bytes, bytes]) -> AudioChunk | StreamError:
    """One raw XREAD entry -> AudioChunk or StreamError; ValueError for a malformed entry."""
    try:
        seq = int(fields[b"seq"])
        attempt = int(fields.get(b"attempt", b"1"))
        if b"error_kind" in fields:
            return StreamError(
                seq=seq,
                attempt=attempt,
                kind=fields[b"error_kind"].decode("utf-8", "replace"),
                message=fields.get(b"error_message", b"").decode("utf-8", "replace"),
            )
        uri = fields.get(b"uri")
        return AudioChunk(
            seq=seq,
            sample_rate=int(fields[b"sample_rate"]),
            pcm=bytes(fields[b"pcm"]),
            final=fields[b"final"] == b"1",
            attempt=attempt,
            uri=uri.decode("utf-8") if uri is not None else None,
            entry_id=entry_id,
        )
    except (KeyError, ValueError) as e:
        raise ValueError(f"audio stream entry {entry_id}: malformed ({e!r})") from None
