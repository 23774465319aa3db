"""`cosyq-worker bench flow --family cosyvoice3`: the DiT flow's timing beside its FLOPs floor."""

from __future__ import annotations

import json

import pytest
import torch

from workers.cli import main
from workers.model.dit.config import DiTConfig, DiTFlowConfig
from workers.tools.bench.dit_flow_stage import bench_dit_flow, dit_json, format_dit_table
from workers.tools.fixtures.random_weights import random_dit_flow

SMALL = DiTFlowConfig(
    pre_lookahead_channels=32, estimator=DiTConfig(dim=64, depth=1, heads=2, dim_head=32)
)


def test_small_dit_flow_bench_reports_time_floor_and_cpu() -> None:
    result = bench_dit_flow(random_dit_flow(SMALL), tokens=10, prompt_tokens=5, threads=1, runs=1)
    assert result.mel_frames == 30 and [row.label for row in result.rows] == ["fp32"]
    (row,) = result.rows
    assert len(row.total_s) == 1 and row.snr_db is None
    assert row.gflop > 0 and row.gemm_gflops > 0 and row.floor_s > 0
    table = format_dit_table(result)
    assert table.startswith("CPU: ") and "floor = FLOPs / measured GEMM rate" in table
    doc = json.loads(dit_json(result))
    assert doc["rows"][0]["floor_s"] == pytest.approx(row.floor_s)
    assert doc["rows"][0]["x_floor"] == pytest.approx(min(row.total_s) / row.floor_s)


def test_bf16_rows_plain_and_with_cpu_kernels_beside_fp32_in_one_run() -> None:
    """fp32, then the same weights in bf16 on plain ops and on the CPU kernels, each with its
    mel SNR against fp32 and its floor in bf16; the kernels' row with its op groups."""
    result = bench_dit_flow(
        random_dit_flow(SMALL), tokens=10, prompt_tokens=5, threads=1, runs=1,
        dtype=torch.bfloat16,
    )  # fmt: skip
    labels = [row.label for row in result.rows]
    assert labels == ["fp32", "bf16, plain ops", "bf16, CPU kernels"]
    fp32, plain, kernels = result.rows
    assert plain.snr_db is not None and kernels.snr_db is not None
    assert kernels.snr_db >= 30.0 and plain.snr_db >= 30.0
    assert fp32.gflop == pytest.approx(kernels.gflop, rel=0.01)
    assert kernels.ops is not None and plain.ops is None
    shares = (kernels.ops.matmul, kernels.ops.attention, kernels.ops.other_ops)
    assert all(0 <= share <= 1 for share in shares) and kernels.ops.matmul > 0
    table = format_dit_table(result)
    assert "bf16, CPU kernels, one profiled pass" in table and "mel SNR dB" in table


def test_bf16_is_for_the_dit_flow_only() -> None:
    with pytest.raises(SystemExit, match="--family cosyvoice3"):
        main(["bench", "flow", "--dtype", "bf16"])


def test_the_family_flag_is_offered_by_bench_flow(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "flow", "--help"])
    assert "--family {cosyvoice2,cosyvoice3}" in capsys.readouterr().out
