"""The quality check end to end: real Redis, the real worker, the tiny model with an LLM that
never stops (every piece a runaway to its length bound). retry synthesizes again with another
seed and records both attempts; fail fails as `quality` with the reason; loudness_lufs gives a
file at the target under the true-peak ceiling."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest
import soundfile

from producer import CosyqClient
from shared.settings import Settings, load_settings
from tests.doubles.rq_workers import run_cosyq_burst
from workers.engine.quality import true_peak

TEXT = "Hello there, friend."


@pytest.fixture
def settings(
    redis_url: str, tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_STORAGE_URL", (tmp_path / "storage").as_uri())
    monkeypatch.setenv("COSYQ_MODEL_DIR", str(tiny_model_dir))
    monkeypatch.setenv("COSYQ_ENGINE", "tests.doubles.engines:runaway_tiny")
    monkeypatch.setenv("COSYQ_DEVICE", "cpu")
    monkeypatch.setenv("COSYQ_THREADS", "1")  # the worker runs in this process: its share
    monkeypatch.setenv("COSYQ_HASH_CACHE_DIR", str(tmp_path / "hashes"))
    monkeypatch.setenv("COSYQ_QUALITY_RETRIES", "1")
    monkeypatch.setenv("COSYQ_RETRY_BACKOFF_S", "0")
    monkeypatch.chdir(tmp_path)
    return load_settings(env_file=None)


def test_runaways_are_retried_failed_or_normalised_as_asked(settings: Settings) -> None:
    import pyloudnorm  # noqa: PLC0415 (with scipy.signal ~1.1 CPU s of every test process's collection)

    with CosyqClient(settings) as client:
        retried = client.submit({"text": TEXT, "seed": 11, "on_suspect": "retry"})
        failed = client.submit({"text": TEXT, "seed": 12, "on_suspect": "fail"})
        loud = client.submit({"text": TEXT, "seed": 13, "loudness_lufs": -16})
        run_cosyq_burst(settings)

        result = client.result(retried, timeout=5)
        quality = result.quality
        assert quality is not None and quality.verdict == "suspect"
        assert quality.action == "retried" and quality.retries == 1
        seeds = [attempt.seed for attempt in quality.attempts]
        assert seeds[0] == 11 and seeds[1] is not None and seeds[1] != 11
        assert all(a.verdict == "suspect" for a in quality.attempts)
        assert any(r.startswith("runaway: piece 0") for r in quality.reasons)
        assert {piece.stop for piece in quality.pieces} == {"length_bound"}

        status = client.status(failed)
        assert status.state == "failed" and status.failure is not None
        assert status.failure.kind == "quality"
        assert "runaway: piece 0 reached the length bound" in status.failure.message
        assert status.retries_left == 0 or status.retries_left is None  # never re-queued

        result = client.result(loud, timeout=5)
        assert result.quality is not None and result.quality.action == "accepted"
        samples, rate = soundfile.read(urlparse(result.uri).path, dtype="float64")
        assert pyloudnorm.Meter(rate).integrated_loudness(samples) == pytest.approx(-16, abs=0.5)
        assert 20 * np.log10(true_peak(samples, rate)) <= -1.0 + 0.05  # PCM16 rounding
        assert result.quality.output_lufs == pytest.approx(-16, abs=0.5)


DELIVERED_RATES = (8000, 16000, 22050, 24000, 44100, 48000)


def independent_true_peak_dbtp(samples: np.ndarray) -> float:
    """BS.1770-4 Annex 2's 4x oversampling, here by FFT (ideal band-limited) interpolation: not
    the worker's polyphase filter."""
    import scipy.signal  # noqa: PLC0415 (as pyloudnorm: on first use)

    upsampled = scipy.signal.resample(samples, 4 * samples.size)
    return float(20 * np.log10(max(np.max(np.abs(upsampled)), np.max(np.abs(samples)))))


@pytest.fixture
def forced_settings(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """The tiny model with every piece forced to 40 speech tokens (1.6 s): no runaways."""
    monkeypatch.setenv("COSYQ_ENGINE", "tests.doubles.engines:tiny_forced")
    return load_settings(env_file=None)


def test_loudness_and_true_peak_hold_on_the_delivered_file_at_every_rate(
    forced_settings: Settings,
) -> None:
    """Issue 45 item 9: the targets hold on the file (decoded and metered on its own), and the
    result reports what the file measures, at every rate, PCM16 WAV and FLAC (and float32)."""
    import pyloudnorm  # noqa: PLC0415 (with scipy.signal ~1.1 CPU s of every test process's collection)

    asked = [
        {"sample_rate": rate, "format": fmt, "loudness_lufs": -16, "true_peak_dbtp": -1.0}
        for rate in DELIVERED_RATES
        for fmt in ("wav", "flac")
    ]
    asked += [  # loud enough that the limiter works: the ceiling case, and float32
        {"sample_rate": 48000, "format": "wav", "loudness_lufs": -5, "true_peak_dbtp": -0.1},
        {"sample_rate": 8000, "format": "flac", "loudness_lufs": -9, "true_peak_dbtp": -0.5},
        {"sample_rate": 44100, "format": "wav", "sample_format": "float32", "loudness_lufs": -20},
    ]
    with CosyqClient(forced_settings) as client:
        ids = [client.submit({"text": TEXT, "seed": 21, **options}) for options in asked]
        run_cosyq_burst(forced_settings)
        for options, job_id in zip(asked, ids, strict=True):
            result = client.result(job_id, timeout=5)
            samples, rate = soundfile.read(urlparse(result.uri).path, dtype="float64")
            assert rate == options["sample_rate"] == result.sample_rate
            lufs = pyloudnorm.Meter(rate).integrated_loudness(samples)
            peak = independent_true_peak_dbtp(samples)
            ceiling = options.get("true_peak_dbtp", -1.0)
            assert lufs == pytest.approx(options["loudness_lufs"], abs=0.5), options
            assert peak <= ceiling, options
            quality = result.quality
            assert quality is not None and quality.output_lufs is not None, options
            assert quality.output_lufs == pytest.approx(lufs, abs=0.05), options
            assert quality.output_true_peak_dbtp is not None, options
            assert quality.output_true_peak_dbtp == pytest.approx(peak, abs=0.2), options
            assert quality.output_true_peak_dbtp <= ceiling, options
