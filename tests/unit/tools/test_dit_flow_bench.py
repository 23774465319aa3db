"""`cosyq-worker bench flow --family cosyvoice3`: the DiT flow's timing beside its FLOPs floor."""

from __future__ import annotations

import json

import pytest

from workers.cli import main
from workers.model.dit.config import DiTConfig, DiTFlowConfig
from workers.tools.bench.dit_flow_stage import bench_dit_flow, dit_json, format_dit_table
from workers.tools.fixtures.random_weights import random_dit_flow

SMALL = DiTFlowConfig(
    pre_lookahead_channels=32, estimator=DiTConfig(dim=64, depth=1, heads=2, dim_head=32)
)


def test_small_dit_flow_bench_reports_time_floor_and_cpu() -> None:
    result = bench_dit_flow(random_dit_flow(SMALL), tokens=10, prompt_tokens=5, threads=1, runs=1)
    assert result.mel_frames == 30 and len(result.total_s) == 1
    assert result.gflop > 0 and result.gemm_gflops > 0 and result.floor_s > 0
    table = format_dit_table(result)
    assert table.startswith("CPU: ") and "floor: FLOPs / measured GEMM rate" in table
    assert json.loads(dit_json(result))["floor_s"] == pytest.approx(result.floor_s)


def test_the_family_flag_is_offered_by_bench_flow(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "flow", "--help"])
    assert "--family {cosyvoice2,cosyvoice3}" in capsys.readouterr().out
