"""A job through the real queue and worker with `COSYQ_LLM_PRECISION=int8` (the tiny CosyVoice 2
and the tiny CosyVoice 3): the worker builds the int8 graph into `COSYQ_ORT_CACHE_DIR`, logs its
choice, and finishes the job."""

from __future__ import annotations

from pathlib import Path

import pytest

from producer import CosyqClient
from shared.settings import Settings, load_settings
from tests.doubles.rq_workers import run_cosyq_burst
from workers.model.directory import ModelDirectory


@pytest.fixture(params=["tiny_model_dir", "tiny3_model_dir"])
def model_dir(request: pytest.FixtureRequest) -> Path:
    return Path(request.getfixturevalue(request.param))


@pytest.fixture
def settings(
    redis_url: str, tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_STORAGE_URL", (tmp_path / "storage").as_uri())
    monkeypatch.setenv("COSYQ_MODEL_DIR", str(model_dir))
    monkeypatch.setenv("COSYQ_DEVICE", "cpu")
    monkeypatch.setenv("COSYQ_THREADS", "1")  # the worker runs in this process: its share
    monkeypatch.setenv("COSYQ_HASH_CACHE_DIR", str(tmp_path / "hashes"))
    monkeypatch.setenv("COSYQ_LLM_PRECISION", "int8")
    monkeypatch.setenv("COSYQ_ORT_CACHE_DIR", str(tmp_path / "graphs"))
    monkeypatch.chdir(tmp_path)
    return load_settings(env_file=None)


def test_an_int8_worker_finishes_a_job_and_keeps_its_graph(settings: Settings) -> None:
    with CosyqClient(settings) as client:
        job = client.submit({"text": "Hello there, a short test.", "seed": 5})
        run_cosyq_burst(settings)
        result = client.result(job, timeout=5)
        assert result.uri and result.speech_tokens > 0
        assert result.model.family == ModelDirectory(settings.model_dir).family
    graphs = list(settings.ort_cache_dir.iterdir())
    assert [g.suffix for g in graphs] == [".onnx"] and graphs[0].name.endswith("-int8-v1.onnx")
