"""Loudness normalisation under a true-peak ceiling, and trimming the silence at the edges.

A delivery spec names an integrated loudness (podcasts -16 LUFS, EBU R128 -23 LUFS) and a
true-peak ceiling (usually -1 dBTP). A plain gain reaches the loudness but may push peaks over
the ceiling, and a gain down to the ceiling may miss the loudness: speech's crest factor is
large. So: gain to the target, then a look-ahead peak limiter (a gain envelope that never
exceeds what each sample's oversampled peak allows, held and smoothed over a few ms so it does
not distort), re-measure and correct, a few rounds; a last whole-file scale guarantees the
ceiling whatever the rounds left. scipy is imported on first use (a worker starts without it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workers.engine.quality import integrated_loudness, silence_runs, true_peak

LIMITER_SMOOTH_S = 0.005  # the envelope's smoothing (and half its hold): 5 ms, no audible pump
LIMITER_MARGIN = 0.97  # aim a little under the ceiling: the estimate is of a 4-8x oversampling
ROUNDS = 4
TOLERANCE_LU = 0.1


@dataclass(frozen=True)
class Normalised:
    samples: np.ndarray
    gain_db: float | None  # None: no loudness to measure (too short or silent), unchanged
    lufs: float | None
    true_peak_dbtp: float | None


def normalise_loudness(
    samples: np.ndarray, sample_rate: int, target_lufs: float, ceiling_dbtp: float
) -> Normalised:
    """(N,) float32 at `target_lufs` with its true peak at or under `ceiling_dbtp`."""
    measured = integrated_loudness(samples, sample_rate)
    if measured is None:
        return Normalised(samples, None, None, _dbtp(samples, sample_rate))
    gain_db = target_lufs - measured
    out = samples.astype(np.float64) * 10.0 ** (gain_db / 20.0)
    ceiling = 10.0 ** (ceiling_dbtp / 20.0)
    for _ in range(ROUNDS):
        out = limit_peaks(out, sample_rate, ceiling * LIMITER_MARGIN)
        now = integrated_loudness(out, sample_rate)
        if now is None or abs(now - target_lufs) <= TOLERANCE_LU:
            break
        out *= 10.0 ** ((target_lufs - now) / 20.0)
    peak = true_peak(out, sample_rate)
    if peak > ceiling:
        out *= ceiling / peak
    final = out.astype(np.float32)
    return Normalised(
        final, gain_db, integrated_loudness(final, sample_rate), _dbtp(final, sample_rate)
    )


def limit_peaks(samples: np.ndarray, sample_rate: int, ceiling: float) -> np.ndarray:
    """A look-ahead limiter: each sample's gain is at most ceiling / (its oversampled peak),
    held over +-2x the smoothing radius and then averaged over +-1x, so the smoothed gain never
    exceeds what any sample within reach needs."""
    if samples.size == 0:
        return samples
    from scipy.ndimage import minimum_filter1d, uniform_filter1d  # noqa: PLC0415 (first use)
    from scipy.signal import resample_poly  # noqa: PLC0415 (on first use)

    factor = 4
    upsampled = np.abs(resample_poly(samples, factor, 1))[: samples.size * factor]
    peaks = np.maximum(upsampled.reshape(samples.size, factor).max(axis=1), np.abs(samples))
    need = np.minimum(1.0, ceiling / np.maximum(peaks, 1e-12))
    if need.min() >= 1.0:
        return samples
    radius = max(1, round(LIMITER_SMOOTH_S * sample_rate))
    held = minimum_filter1d(need, size=4 * radius + 1, mode="nearest")
    gain = uniform_filter1d(held, size=2 * radius + 1, mode="nearest")
    return samples * gain


def trim_bounds(
    samples: np.ndarray, sample_rate: int, *, silence_dbfs: float, margin_s: float
) -> tuple[int, int]:
    """The [start, end) samples left when leading and trailing silence are cut down to
    `margin_s` (all of them when all is silence)."""
    lead, _, trail = silence_runs(samples, sample_rate, silence_dbfs)
    if lead + trail >= samples.size / sample_rate:  # all silence: keep it as it is
        return 0, samples.size
    start = round(max(0.0, lead - margin_s) * sample_rate)
    return start, samples.size - round(max(0.0, trail - margin_s) * sample_rate)


def _dbtp(samples: np.ndarray, sample_rate: int) -> float | None:
    peak = true_peak(samples, sample_rate)
    return 20.0 * np.log10(peak) if peak > 0 else None
