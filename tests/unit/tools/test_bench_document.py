"""`cosyq-worker bench document`: the report's shape and verdicts, and a real assembly-only run
(a private redis-server, no model) whose JSON the table is printed from."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from workers.cli import main
from workers.tools.bench.document_cli import format_table


def _row(workers: int, wall_s: float, plain_wall_s: float) -> dict[str, Any]:
    return {
        "workers": workers,
        "wall_s": wall_s,
        "segments": 10,
        "audio_s": 120.0,
        "plain_wall_s": plain_wall_s,
        "overhead_per_segment_s": (wall_s - plain_wall_s) / 10,
        "overhead_share": (wall_s - plain_wall_s) / plain_wall_s,
    }


def test_table_has_a_row_per_pool_size_and_a_verdict_per_target() -> None:
    report = {
        "cpu": {"model": "Test CPU", "cores": 2},
        "load_average_before": [1.0, 1.0, 1.0],
        "load_average": [2.0, 1.5, 1.0],
        "targets": {"overhead_share": 0.05, "assembly_peak_rss_mb": 200.0},
        "document_chars": 6000,
        "documents": [_row(1, 103.0, 100.0), _row(2, 64.8, 60.0)],
        "speed_up_2_over_1": 103.0 / 64.8,
        "assembly": [
            {"minutes": 10.0, "segments": 10, "peak_rss_mb": 93.0, "wall_s": 4.0},
            {"minutes": 60.0, "segments": 60, "peak_rss_mb": 250.0, "wall_s": 20.0},
        ],
    }
    lines = format_table(report)
    assert "Test CPU, 2 cores" in lines[0] and "1.00 before, 2.00 after" in lines[0]
    one = next(line for line in lines if line.startswith("1 "))
    two = next(line for line in lines if line.startswith("2 "))
    assert "+3.0%" in one and one.endswith("met") and "300" in one  # ms per segment
    assert "+8.0%" in two and two.endswith("missed")
    assert any("1.59x" in line for line in lines)
    ten = next(line for line in lines if line.startswith("10 min"))
    hour = next(line for line in lines if line.startswith("60 min"))
    assert ten.endswith("met") and hour.endswith("missed")


def test_assembly_only_run_reports_the_host_targets_and_peak_rss(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["bench", "document", "--assembly-only", "--assembly-minutes", "1,2", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["cpu"]["model"] and report["cpu"]["cores"] >= 1
    assert len(report["load_average_before"]) == 3 and len(report["load_average"]) == 3
    assert report["targets"] == {"overhead_share": 0.05, "assembly_peak_rss_mb": 200.0}
    assert "documents" not in report
    assert [(run["minutes"], run["segments"]) for run in report["assembly"]] == [(1, 1), (2, 2)]
    for run in report["assembly"]:
        assert run["duration_s"] == pytest.approx(60.0 * run["segments"], abs=1.0)
        assert 0 < run["peak_rss_mb"] < 1000 and run["wall_s"] > 0
        # the child's own peak: ru_maxrss survives exec and would report this process's
        assert run["peak_source"] == ("VmHWM" if sys.platform == "linux" else "ru_maxrss")
    assert any(line.startswith("2 min") for line in format_table(report))
