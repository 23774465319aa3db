"""`cosyq-worker bench [batch] --family cosyvoice3`: end to end on the tiny CosyVoice 3, and the
full-random cache kept apart per family (the FULL model itself is never written here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.cli import main
from workers.tools.bench.engine_bench import BenchOptions, model_directory
from workers.tools.fixtures import full_random

ARGS = ["--config", "tiny", "--family", "cosyvoice3", "--tokens", "5", "--threads", "1"]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_engine_bench_runs_the_tiny_cosyvoice3(
    dtype: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The LLM's precision is its body's: CosyVoice 3's float32 text table comes first among
    its parameters and once made a bf16 LLM read as fp32."""
    argv = ["bench", *ARGS, "--runs", "1", "--text", "Hello.", "--no-floors", "--json"]
    assert main([*argv, "--dtype", dtype, "--omp-wait-policy", "inherit"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["family"] == "cosyvoice3" and doc["config"] == "tiny"
    assert doc["precisions"]["llm"] == dtype


def test_engine_bench_table_names_the_family(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", *ARGS, "--runs", "1", "--text", "Hello.", "--no-floors"]
    assert main([*argv, "--omp-wait-policy", "inherit"]) == 0
    out = capsys.readouterr().out
    assert "cosyq-worker bench: tiny cosyvoice3" in out and "mean inference s" in out
    assert "(targets: fp32" not in out  # CosyVoice 2's targets are never shown for 3


def test_batch_bench_runs_the_tiny_cosyvoice3(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "batch", *ARGS, "--batch-sizes", "1,2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["family"] == "cosyvoice3"
    assert [row["batch_size"] for row in doc["rows"]] == [1, 2]
    assert all(row["audio_s"] > 0 for row in doc["rows"])


def test_full_random_caches_one_directory_per_family(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: dict[str, Path] = {}

    def ensure(root: Path, *, family: str, **_: object) -> Path:
        written[family] = root
        return root

    monkeypatch.setattr(full_random, "ensure_random_model", ensure)
    for family in ("cosyvoice2", "cosyvoice3"):
        options = BenchOptions(config="full-random", family=family, cache_dir=tmp_path)
        assert model_directory(options, tmp_path / "work") == written[family]
    assert written["cosyvoice2"] == tmp_path / "model"  # where CosyVoice 2's cache always was
    assert written["cosyvoice3"] != written["cosyvoice2"]
    assert written["cosyvoice3"].parent == tmp_path
