"""`cosyq-worker bench queue` with no arguments: the tiny model in a temporary folder, a private
redis-server, and the table (it used to end in a traceback: no model)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from workers.cli import main

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)  # three worker starts and a tiny-model write; slow on a busy machine
def test_bench_queue_runs_on_the_tiny_model_by_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [n for n in os.environ if n.startswith("COSYQ_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no stray .env
    # one thread: two spinning OpenMP threads beside the other test process ran the warm-ups
    # 10x slower (8.8 s against 0.8 s at load 4); the engine and the model stay the defaults
    monkeypatch.setenv("COSYQ_THREADS", "1")
    assert main(["bench", "queue", "--jobs", "1", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "queue benchmark: 1 jobs per run" in out
    assert "engine workers.service.default_engine:engine_from_settings" in out
    assert "cosyq worker" in out and "bare rq SimpleWorker" in out
    assert "recycle cost, process start -> worker_ready (n=1)" in out
