"""A result's loudness and true peak, set and measured on the file that is delivered.

`process_audio` (quality.py) resamples to the request's rate before it normalises, so the
K-weighting and the oversampled peaks are those of the delivered rate (BS.1770's filters at
8 kHz differ from 24 kHz's, and resampling moves inter-sample peaks). Encoding may still move
them: PCM16 rounds each sample, a lossy codec reshapes the waveform and overshoots. So the
encoded bytes are decoded and measured again, as any meter reading the file would, and a plain
gain corrects what the encoding moved (the ceiling first, then the loudness, never past the
ceiling), a few rounds. The report's `output_lufs` and `output_true_peak_dbtp` are that last
measure of the decoded file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared.audio import EncodedAudio, decode_audio, encode_audio
from shared.jobs import DEFAULT_TRUE_PEAK_DBTP, SynthesisRequest
from shared.results import QualityReport
from workers.engine.loudness import TOLERANCE_LU
from workers.engine.quality import integrated_loudness, true_peak

CORRECTION_ROUNDS = 3  # encode, decode, measure, correct: PCM needs one, a lossy codec two
# The delivered file's true peak is kept this far under the ceiling by our estimate: ours
# (polyphase, 8x below 48 kHz) and an ideal band-limited (FFT) 4x interpolation of the same
# speech differ by up to 0.15 dB either way (measured at 8-48 kHz), most where the content
# reaches near Nyquist; any meter then reads it under the ceiling.
PEAK_MARGIN_DB = 0.2
SMALLEST_GAIN_DB = 0.005  # a correction smaller than this changes nothing a meter shows


@dataclass(frozen=True)
class Levels:
    """What a meter reading the delivered file finds."""

    lufs: float | None  # None: too short or silent to have an integrated loudness
    true_peak_dbtp: float | None  # None: all zeros


def encode_delivered(
    samples: np.ndarray, rate: int, request: SynthesisRequest, report: QualityReport
) -> tuple[EncodedAudio, QualityReport]:
    """Encode (N,) float32 samples at the request's rate; with `loudness_lufs`, correct and
    report the levels the decoded file has."""
    encoded = _encode(samples, rate, request)
    if request.loudness_lufs is None:
        return encoded, report
    target = request.loudness_lufs
    ceiling = DEFAULT_TRUE_PEAK_DBTP if request.true_peak_dbtp is None else request.true_peak_dbtp
    corrected_db = 0.0
    work = samples.astype(np.float64)
    for _ in range(CORRECTION_ROUNDS):
        levels = measure_file(encoded)
        step = correction_db(levels, target, ceiling)
        if step == 0.0:
            break
        work *= 10.0 ** (step / 20.0)
        corrected_db += step
        encoded = _encode(work.astype(np.float32), rate, request)
    else:
        levels = measure_file(encoded)
    gain_db = report.gain_db
    if gain_db is not None or corrected_db != 0.0:
        gain_db = (gain_db or 0.0) + corrected_db
    update = {
        "gain_db": gain_db,
        "output_lufs": levels.lufs,
        "output_true_peak_dbtp": levels.true_peak_dbtp,
    }
    return encoded, report.model_copy(update=update)


def measure_file(encoded: EncodedAudio) -> Levels:
    """Integrated loudness and true peak of the encoded file, decoded as a player would."""
    decoded, rate = decode_audio(encoded.data)
    peak = true_peak(decoded, rate)
    return Levels(integrated_loudness(decoded, rate), 20.0 * np.log10(peak) if peak > 0 else None)


def correction_db(levels: Levels, target_lufs: float, ceiling_dbtp: float) -> float:
    """The gain that brings the file's peak PEAK_MARGIN_DB under the ceiling, else to the
    target loudness without passing that; 0.0 when it is already there."""
    if levels.true_peak_dbtp is None:
        return 0.0
    headroom = ceiling_dbtp - PEAK_MARGIN_DB - levels.true_peak_dbtp
    if headroom < 0.0:
        step = headroom
    elif levels.lufs is not None and abs(levels.lufs - target_lufs) > TOLERANCE_LU:
        step = min(target_lufs - levels.lufs, max(0.0, headroom))
    else:
        step = 0.0
    return step if abs(step) >= SMALLEST_GAIN_DB else 0.0


def _encode(samples: np.ndarray, rate: int, request: SynthesisRequest) -> EncodedAudio:
    return encode_audio(
        samples,
        rate,
        request.format,
        target_rate=request.sample_rate,
        sample_format=request.sample_format,
    )
