"""Measures of one utterance that find the model's known failures without anyone listening.

Zero-shot LLM TTS fails in a few recognisable ways: a segment dropped (audio far shorter than
its text), a sentence read twice or babble up to the length bound (far longer, and the LLM did
not sample a stop id), a long silence inside the speech, clipping. These functions measure
them on the engine's 24 kHz float samples; what counts as suspect is the service's policy.

Silence is judged on 20 ms frames (a syllable is ~200 ms, so a frame never hides one) whose
RMS is under a threshold in dBFS. Only the pieces' own samples are measured: the pauses the
join inserts on purpose between pieces and for `<break>`s are cut out first.

pyloudnorm (and with it scipy.signal) is imported on first use, not when this module is: together
they are half a second (seconds on a loaded host). A worker imports them before it says ready
(`import_measures`, COSYQ_QUALITY_IMPORT_AT_START), so that no job's timeout pays them; the
tests' workers, started hundreds of times for jobs shorter than one gating block, turn it off.
The true peak's oversampling is scipy's `resample_poly` filter written out in numpy
(`oversampled`), so that a job under one gating block does not import scipy.signal for it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

FRAME_S = 0.02
CLIP_LEVEL = 0.989  # HiFT clamps to its audio_limit (0.99): a sample there was cut off
TRUE_PEAK_OVERSAMPLING = 4  # ITU-R BS.1770-4 Annex 2: 4x at 48 kHz (more at lower rates)
LOUDNESS_MIN_S = 0.4  # one gating block: shorter audio has no integrated loudness
REPEAT_WINDOW = 50  # the last 2 s of speech tokens (25 Hz)
REPEAT_MAX_PERIOD = 25  # loops of up to 1 s


@dataclass(frozen=True)
class AudioMeasures:
    """What `measure_audio` found (seconds, shares, dB)."""

    speech_s: float  # the pieces' own audio, inserted pauses excluded
    longest_silence_s: float  # inside the speech (between its first and last sound)
    leading_silence_s: float
    trailing_silence_s: float
    clipped_share: float  # samples at the vocoder's limit / all samples
    peak_dbfs: float | None  # None: all zeros
    loudness_lufs: float | None  # None: shorter than one gating block, or silent
    true_peak_dbtp: float | None


def measure_audio(
    samples: np.ndarray,
    sample_rate: int,
    spans: Sequence[tuple[int, int]] = (),
    *,
    silence_dbfs: float = -50.0,
) -> AudioMeasures:
    """Measure (N,) float samples; `spans` are the pieces' [start, end) sample ranges (none:
    the whole array is speech). Levels are measured on the whole utterance."""
    audio = np.asarray(samples, dtype=np.float32)
    speech = _speech_only(audio, spans)
    lead, inner, trail = silence_runs(speech, sample_rate, silence_dbfs)
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    return AudioMeasures(
        speech_s=speech.size / sample_rate,
        longest_silence_s=inner,
        leading_silence_s=lead,
        trailing_silence_s=trail,
        clipped_share=float(np.count_nonzero(np.abs(audio) >= CLIP_LEVEL)) / max(audio.size, 1),
        peak_dbfs=_db(peak),
        loudness_lufs=integrated_loudness(audio, sample_rate),
        true_peak_dbtp=_db(true_peak(audio, sample_rate)),
    )


def _speech_only(audio: np.ndarray, spans: Sequence[tuple[int, int]]) -> np.ndarray:
    if not spans:
        return audio
    parts = [audio[max(0, a) : max(0, b)] for a, b in spans]
    return np.concatenate(parts) if parts else audio[:0]


def silence_runs(samples: np.ndarray, sample_rate: int, silence_dbfs: float) -> tuple[float, ...]:
    """(leading, longest inside, trailing) silence in seconds, on 20 ms frames."""
    frame = max(1, round(FRAME_S * sample_rate))
    count = samples.size // frame
    if count == 0:
        return (samples.size / sample_rate, 0.0, 0.0)
    frames = samples[: count * frame].astype(np.float64).reshape(count, frame)
    rms = np.sqrt(np.mean(frames * frames, axis=1))
    silent = rms < 10.0 ** (silence_dbfs / 20.0)
    if silent.all():
        return (samples.size / sample_rate, 0.0, 0.0)
    sounding = np.flatnonzero(~silent)
    first, last = int(sounding[0]), int(sounding[-1])
    lead = first * frame / sample_rate
    trail = (samples.size - (last + 1) * frame) / sample_rate
    return lead, longest_run(silent[first : last + 1]) * frame / sample_rate, trail


def longest_run(mask: np.ndarray) -> int:
    """The longest run of True in a 1-D bool array."""
    if not mask.any():
        return 0
    padded = np.concatenate(([0], mask.astype(np.int8), [0]))
    edges = np.flatnonzero(np.diff(padded))
    return int(np.max(edges[1::2] - edges[::2]))


def integrated_loudness(samples: np.ndarray, sample_rate: int) -> float | None:
    """ITU-R BS.1770-4 integrated loudness (LUFS) by pyloudnorm; None when undefined."""
    if samples.size < LOUDNESS_MIN_S * sample_rate:
        return None
    import pyloudnorm  # noqa: PLC0415 (on first use: see the module's docstring)

    value = float(pyloudnorm.Meter(sample_rate).integrated_loudness(samples.astype(np.float64)))
    return value if math.isfinite(value) else None


def import_measures() -> None:
    """Import now what `integrated_loudness` and the loudness limiter import on first use
    (pyloudnorm, scipy.signal, scipy.ndimage): a worker calls this before it says ready, so
    that its first job's timeout does not pay 0.5-1 s of imports (2 s and more when loaded)."""
    import pyloudnorm  # noqa: F401, PLC0415
    import scipy.ndimage  # noqa: PLC0415
    import scipy.signal  # noqa: F401, PLC0415


def true_peak(samples: np.ndarray, sample_rate: int) -> float:
    """Linear true-peak estimate: the largest magnitude after oversampling (polyphase FIR),
    4x at 48 kHz and above, 8x below (BS.1770-4: the oversampled rate should reach 192 kHz)."""
    if samples.size == 0:
        return 0.0
    factor = TRUE_PEAK_OVERSAMPLING * (2 if sample_rate < 48_000 else 1)
    upsampled = oversampled(samples.astype(np.float64), factor)
    return float(max(np.max(np.abs(upsampled)), np.max(np.abs(samples))))


def oversampled(samples: np.ndarray, factor: int) -> np.ndarray:
    """(N,) -> (N * factor,): `scipy.signal.resample_poly(samples, factor, 1)` (its default
    Kaiser-windowed sinc, beta 5, 10 zero crossings a side, unit gain at DC per phase) as one
    convolution per output phase."""
    half_len = 10 * factor  # the filter has 2 * half_len + 1 taps, centred on sample half_len
    m = np.arange(2 * half_len + 1) - half_len
    taps = np.sinc(m / factor) * np.kaiser(2 * half_len + 1, 5.0)
    taps *= factor / taps.sum()
    out = np.empty(samples.size * factor, dtype=np.float64)
    for phase in range(factor):
        first = (phase + half_len) % factor  # the taps that meet real (not inserted) samples
        shift = (phase + half_len - first) // factor
        full = np.convolve(samples, taps[first::factor])
        out[phase::factor] = full[shift : shift + samples.size]
    return out


def tail_repetition(tokens: Sequence[int] | np.ndarray) -> float:
    """How periodic the last speech tokens are: the largest share, over periods of 1 to 25
    tokens, of the last 2 s whose token equals the one a period earlier (random tokens ~0, a
    loop or one held token ~1). A runaway LLM typically ends in such a loop."""
    ids = np.asarray(tokens, dtype=np.int64)
    best = 0.0
    for period in range(1, REPEAT_MAX_PERIOD + 1):
        window = min(REPEAT_WINDOW, ids.size - period)
        if window < 2 * period or window < 10:
            break
        tail = ids[ids.size - window :]
        earlier = ids[ids.size - window - period : ids.size - period]
        best = max(best, float(np.mean(tail == earlier)))
    return best


def _db(linear: float) -> float | None:
    return 20.0 * math.log10(linear) if linear > 0 else None
