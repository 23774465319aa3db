"""A job through the real queue and worker with `COSYQ_LLM_PRECISION=int8` (tiny model): the
worker builds the int8 graph into `COSYQ_ORT_CACHE_DIR`, logs its choice, and finishes the job."""

from __future__ import annotations

from pathlib import Path

import pytest

from producer import CosyqClient
from shared.settings import Settings, load_settings
from tests.doubles.rq_workers import run_cosyq_burst


@pytest.fixture
def settings(
    redis_url: str, tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_STORAGE_URL", (tmp_path / "storage").as_uri())
    monkeypatch.setenv("COSYQ_MODEL_DIR", str(tiny_model_dir))
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
        assert result.uri
    graphs = list(settings.ort_cache_dir.iterdir())
    assert [g.suffix for g in graphs] == [".onnx"] and graphs[0].name.endswith("-int8-v1.onnx")
