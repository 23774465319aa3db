"""The measures on synthetic audio whose answer is known, and loudness/trim processing."""

from __future__ import annotations

import numpy as np
import pytest

from workers.engine.loudness import normalise_loudness, trim_bounds
from workers.engine.quality import CLIP_LEVEL, measure_audio, oversampled, true_peak

RATE = 24000


def tone(seconds: float, amplitude: float = 0.3, hz: float = 440.0) -> np.ndarray:
    t = np.arange(round(seconds * RATE)) / RATE
    return (amplitude * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * RATE), dtype=np.float32)


def test_an_inserted_two_second_silence_is_the_longest_silence() -> None:
    audio = np.concatenate([tone(1.0), silence(2.0), tone(1.0)])
    m = measure_audio(audio, RATE)
    assert m.longest_silence_s == pytest.approx(2.0, abs=0.04)
    assert m.leading_silence_s == 0.0 and m.trailing_silence_s == pytest.approx(0.0, abs=0.02)
    assert m.speech_s == pytest.approx(4.0)


def test_pauses_we_insert_between_pieces_are_not_counted() -> None:
    first, second = tone(1.0), tone(1.0)
    gap = silence(3.0)  # a <break time="3s"/> the join inserted on purpose
    audio = np.concatenate([silence(0.5), first, gap, second])
    spans = [(12000, 12000 + first.size), (12000 + first.size + gap.size, audio.size)]
    m = measure_audio(audio, RATE, spans)
    assert m.longest_silence_s == 0.0 and m.leading_silence_s == 0.0
    assert m.speech_s == pytest.approx(2.0)
    # a silence the model made inside a piece still counts
    inside = np.concatenate([tone(0.5), silence(1.5), tone(0.5)])
    m = measure_audio(np.concatenate([inside, gap, second]), RATE, [(0, inside.size)])
    assert m.longest_silence_s == pytest.approx(1.5, abs=0.04)


def test_leading_and_trailing_silence() -> None:
    m = measure_audio(np.concatenate([silence(0.8), tone(1.0), silence(1.2)]), RATE)
    assert m.leading_silence_s == pytest.approx(0.8, abs=0.02)
    assert m.trailing_silence_s == pytest.approx(1.2, abs=0.02)


def test_clipped_samples_and_peak() -> None:
    audio = tone(1.0, amplitude=0.5)
    audio[:240] = CLIP_LEVEL + 0.001  # 1% of the samples at the vocoder's limit
    m = measure_audio(audio, RATE)
    assert m.clipped_share == pytest.approx(0.01)
    assert m.peak_dbfs == pytest.approx(20 * np.log10(CLIP_LEVEL + 0.001), abs=1e-3)
    assert measure_audio(tone(1.0), RATE).clipped_share == 0.0


def test_a_minus_23_lufs_tone_measures_as_pyloudnorm_does() -> None:
    import pyloudnorm  # noqa: PLC0415 (with scipy.signal ~1.1 CPU s of every test process's collection)

    audio = tone(3.0, amplitude=0.1, hz=1000.0)
    meter = pyloudnorm.Meter(RATE)
    target = pyloudnorm.normalize.loudness(
        audio.astype(np.float64), meter.integrated_loudness(audio.astype(np.float64)), -23.0
    ).astype(np.float32)
    m = measure_audio(target, RATE)
    assert m.loudness_lufs == pytest.approx(-23.0, abs=0.05)
    assert measure_audio(tone(0.2), RATE).loudness_lufs is None  # under one gating block
    assert measure_audio(silence(1.0), RATE).loudness_lufs is None


def test_true_peak_sees_an_inter_sample_peak() -> None:
    # a quarter-rate sine sampled at 45 degrees: every sample at 0.707, the wave peaks at 1
    n = np.arange(4800)
    audio = np.sin(np.pi / 2 * n + np.pi / 4).astype(np.float32)
    assert np.max(np.abs(audio)) == pytest.approx(0.7071, abs=1e-3)
    assert true_peak(audio, RATE) == pytest.approx(1.0, abs=0.02)


@pytest.mark.parametrize("size", [1, 2, 7, 41, 4800, 24001])
@pytest.mark.parametrize("factor", [2, 4, 8])
def test_the_oversampling_is_scipys_resample_poly(size: int, factor: int) -> None:
    from scipy.signal import resample_poly  # noqa: PLC0415 (the reference, tests only)

    audio = np.random.default_rng(size).standard_normal(size)
    expected = resample_poly(audio, factor, 1)
    got = oversampled(audio, factor)
    assert got.shape == expected.shape
    assert float(np.max(np.abs(got - expected))) < 1e-12


@pytest.mark.parametrize("target", [-16.0, -23.0])
def test_normalising_noise_reaches_the_target_under_the_ceiling(target: float) -> None:
    import pyloudnorm  # noqa: PLC0415 (with scipy.signal ~1.1 CPU s of every test process's collection)

    rng = np.random.default_rng(0)
    audio = (rng.standard_normal(RATE * 4) * 0.05).astype(np.float32)
    audio[RATE : RATE + 50] = 0.95  # a spike a plain gain would push over the ceiling
    done = normalise_loudness(audio, RATE, target, -1.0)
    meter = pyloudnorm.Meter(RATE)
    assert meter.integrated_loudness(done.samples.astype(np.float64)) == pytest.approx(
        target, abs=0.5
    )
    assert 20 * np.log10(true_peak(done.samples, RATE)) <= -1.0 + 1e-6
    assert done.gain_db is not None


def test_trim_keeps_the_margin() -> None:
    audio = np.concatenate([silence(1.0), tone(1.0), silence(2.0)])
    start, end = trim_bounds(audio, RATE, silence_dbfs=-50.0, margin_s=0.15)
    assert (end - start) / RATE == pytest.approx(1.3, abs=0.03)
    assert start / RATE == pytest.approx(0.85, abs=0.03)
    quiet = silence(1.0)
    assert trim_bounds(quiet, RATE, silence_dbfs=-50.0, margin_s=0.1) == (0, quiet.size)
