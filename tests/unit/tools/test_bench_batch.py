"""`cosyq-worker bench batch` on the tiny model: the table, the JSON rows, argument errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workers.cli import main
from workers.tools.bench.batch import JSON_KEYS
from workers.tools.bench.batch_cli import parse_batch_sizes

ARGS = ["bench", "batch", "--batch-sizes", "1,3", "--tokens", "5", "--threads", "1"]


def test_json_has_the_plain_run_and_the_listed_keys_per_batch_size(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*ARGS, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["dtype"] == "fp32" and doc["tokens"] == 5 and len(doc["load_average"]) == 2
    assert doc["flow"] == "exact"  # COSYQ_BATCH_FLOW's default
    assert doc["plain_throughput"] == pytest.approx(
        doc["plain_audio_s"] / doc["plain_wall_s"], rel=1e-3
    )
    assert doc["b1_over_plain"] == pytest.approx(
        doc["rows"][0]["throughput"] / doc["plain_throughput"], rel=1e-3
    )
    assert [row["batch_size"] for row in doc["rows"]] == [1, 3]
    for row in doc["rows"]:
        assert tuple(row) == JSON_KEYS
        assert row["jobs"] == row["batch_size"]
        assert row["audio_s"] / row["jobs"] == pytest.approx(doc["rows"][0]["audio_s"])
        assert row["audio_s"] >= row["jobs"] * 5 * 0.04  # 5 forced tokens per piece: 0.2 s
        assert row["throughput"] == pytest.approx(row["audio_s"] / row["wall_s"], rel=1e-3)
        assert 0 < row["p50_latency_s"] <= row["p95_latency_s"] <= row["wall_s"] + 1e-3
        assert row["peak_rss_gb"] > 0.1


def test_the_table_has_every_column_and_the_plain_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert "cosyq-worker bench batch: tiny" in out and "5 tokens per piece" in out
    for column in ("audio s/s", "speed-up", "p50 s", "p95 s", "llm s/job", "flow s/job"):
        assert column in out
    assert "plain engine.run" in out and "B=1 / plain:" in out and "load average" in out
    assert " 1.00x " in out  # B=1 against itself


def test_the_joined_flow_is_named_in_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*ARGS, "--dtype", "bf16", "--flow", "joined", "--batch-sizes", "2"]) == 0
    out = capsys.readouterr().out
    assert "bf16, 5 tokens per piece, batch flow joined, LLM native" in out


def test_int8_batches_and_its_decode_is_timed_beside_native(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    int8 = [*ARGS, "--llm-precision", "int8", "--cache-dir", str(tmp_path), "--batch-sizes", "2"]
    assert main([*int8, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.splitlines()[-1])  # after the graph's log lines
    assert doc["llm_precision"] == "int8" and doc["rows"][0]["batch_size"] == 2
    assert main([*int8, "--decode-only", "--batch-sizes", "2,3"]) == 0
    out = capsys.readouterr().out
    assert "CPU: " in out and "; ISA: " in out
    assert "5 forced tokens each" in out and "load average" in out
    rows = [
        line.split(" | ")
        for line in out.splitlines()
        if line.startswith("| 2 ") or line.startswith("| 3 ")
    ]
    assert [(row[0], row[1]) for row in rows] == [
        ("| 2", "int8 (ORT)"),
        ("| 2", "float32"),
        ("| 3", "int8 (ORT)"),
        ("| 3", "float32"),
    ]
    assert all(float(row[2]) > 0 for row in rows) and rows[1][5] == "1.00x |"
    assert [p.suffix for p in (tmp_path / "onnx").iterdir()] == [".onnx"]  # one graph, cached
    with pytest.raises(SystemExit, match="--decode-only prints its table only"):
        main([*int8, "--decode-only", "--json"])


def test_batch_sizes_must_be_positive_integers() -> None:
    assert parse_batch_sizes("1, 2,8") == [1, 2, 8]
    for bad in ("", "0,2", "a,b"):
        with pytest.raises(SystemExit, match="--batch-sizes"):
            parse_batch_sizes(bad)
