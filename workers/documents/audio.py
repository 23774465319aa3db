"""A document's segments -> one encoded file, streamed: one segment in memory at a time.

Each segment (WAV float32 at the document's rate) is read whole (at most a job's length of
audio), faded as pieces inside a job are (`workers.engine.fades`: in at every start but the
first, out at every end but the last), written into one libsndfile encoder after its pause, and
dropped. So the memory an hour-long document needs is that of its longest segment.

Times: each segment's start and end (seconds) are where its samples landed, and each piece of
its job lands at the segment's start plus the piece's own time, so the manifest and captions
follow the file exactly.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from shared.audio import soundfile_codecs
from shared.captions import Cue, cues_from_pieces, cut_cue
from shared.document_state import SegmentDone, SegmentPlan
from shared.errors import InvalidRequestError
from workers.engine.fades import DEFAULT_FADE_S, fade_ramp

FADE_S = DEFAULT_FADE_S  # segments fade as the pieces inside a job do


@dataclass(frozen=True)
class PlacedSegment:
    """Where one segment landed in the document."""

    index: int
    text: str
    job_id: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class AssembledAudio:
    frames: int
    sample_rate: int
    segments: list[PlacedSegment]
    cues: list[Cue]

    @property
    def duration_s(self) -> float:
        return self.frames / self.sample_rate


ReadSegment = Callable[[str], bytes]  # URI -> the segment's encoded bytes


def write_document(
    path: Path,
    parts: Iterable[tuple[SegmentPlan, SegmentDone]],
    *,
    count: int,
    read: ReadSegment,
    fmt: str,
    sample_format: str,
    sample_rate: int,
) -> AssembledAudio:
    """Write the segments in order (each after its pause) to `path` in `fmt`."""
    container, subtype = soundfile_codecs()[(fmt, sample_format)]
    fade = round(FADE_S * sample_rate)
    position = 0
    placed: list[PlacedSegment] = []
    cues: list[Cue] = []
    with sf.SoundFile(
        path, "w", samplerate=sample_rate, channels=1, format=container, subtype=subtype
    ) as out:
        for number, (plan, done) in enumerate(parts):
            samples = _segment_samples(read(done.uri), sample_rate, done.uri)
            if number > 0:
                gap = round(plan.pause_before_s * sample_rate)
                out.write(np.zeros(gap, dtype=np.float32))
                position += gap
            _fade(samples, fade, first=number == 0, last=number == count - 1)
            out.write(samples)
            start = position / sample_rate
            position += samples.shape[0]
            placed.append(
                PlacedSegment(plan.index, plan.plain, done.job_id, start, position / sample_rate)
            )
            found = cues_from_pieces(done.pieces, offset_s=start)
            cues.extend(found or cut_cue(start, position / sample_rate, plan.plain))
    return AssembledAudio(position, sample_rate, placed, cues)


def _segment_samples(data: bytes, sample_rate: int, uri: str) -> np.ndarray:
    samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=False)
    if rate != sample_rate or samples.ndim != 1:
        raise InvalidRequestError(
            f"{uri}: {rate} Hz, {samples.ndim} channel(s); expected {sample_rate} mono"
        )
    return np.ascontiguousarray(samples)


def _fade(samples: np.ndarray, fade: int, *, first: bool, last: bool) -> None:
    """In place, as `join_pieces` fades a piece (at most half the piece each side)."""
    n = min(fade, samples.shape[0] // 2)
    if not n:
        return
    ramp = fade_ramp(n)
    if not first:
        samples[:n] *= ramp
    if not last:
        samples[-n:] *= ramp[::-1]
