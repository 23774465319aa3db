"""The quality check end to end: real Redis, the real worker, the tiny model with an LLM that
never stops (every piece a runaway to its length bound). retry synthesizes again with another
seed and records both attempts; fail fails as `quality` with the reason; loudness_lufs gives a
file at the target under the true-peak ceiling."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pyloudnorm
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
    monkeypatch.setenv("COSYQ_HASH_CACHE_DIR", str(tmp_path / "hashes"))
    monkeypatch.setenv("COSYQ_QUALITY_RETRIES", "1")
    monkeypatch.setenv("COSYQ_RETRY_BACKOFF_S", "0")
    monkeypatch.chdir(tmp_path)
    return load_settings(env_file=None)


def test_runaways_are_retried_failed_or_normalised_as_asked(settings: Settings) -> None:
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
