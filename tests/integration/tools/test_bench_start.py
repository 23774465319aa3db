"""`cosyq-worker bench start`: real worker processes on a private redis-server, timed from
process start to `worker_ready` (issue 46), as a table and as JSON."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.doubles.harness import write_model_dir
from workers.cli import main


def test_bench_start_prints_min_and_median_of_real_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [n for n in os.environ if n.startswith("COSYQ_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no stray .env
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[3]))  # the test engine
    model = str(write_model_dir(tmp_path / "model"))
    argv = ["bench", "start", "--engine", "tests.doubles.engines:fast", "--model-dir", model]
    assert main([*argv, "--repeats", "2", "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    assert len(figures["start_to_ready_s"]) == 2 and figures["target_s"] == 0.8
    assert 0 < figures["min_s"] <= figures["median_s"] <= figures["max_s"] < 120
    assert figures["engine"] == "tests.doubles.engines:fast"
    linux = sys.platform == "linux"  # the template mode too, as the pool forks (Linux only)
    assert len(figures["fork_to_ready_s"]) == (2 if linux else 0)
    if linux:
        assert 0 < figures["fork_min_s"] <= figures["fork_median_s"] <= figures["fork_max_s"]
        assert figures["template_start_s"] > 0
    assert main([*argv, "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "worker start benchmark: engine tests.doubles.engines:fast" in out
    assert "process start -> worker_ready: min" in out
    assert ("fork request -> worker_ready: min" in out) == linux


def test_bench_start_refuses_no_starts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "start", "--repeats", "0"]) == 2  # one line, no traceback
    assert "cosyq-worker: --repeats must be >= 1" in capsys.readouterr().err
