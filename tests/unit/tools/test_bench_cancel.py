"""`cosyq-worker bench cancel` on the tiny model: a stop set mid-LLM ends the request, the
latency is reported against issue 24's target, and the verdict follows the figures."""

from __future__ import annotations

import json

import pytest

from workers.tools.bench import cancel
from workers.tools.bench.cancel import (
    CancelFigures,
    format_json,
    format_table,
    run_cancel_bench,
)
from workers.tools.bench.engine_bench import BenchOptions

pytestmark = pytest.mark.timeout(600)


def figures(latency_s: float, check_ms: float = 100.0) -> CancelFigures:
    return CancelFigures(
        cpu="CPU: test",
        load_average=(0.0, 0.0),
        model="tiny",
        dtype="fp32",
        llm_step_s=0.07,
        llm_s=7.0,
        cancel_at_s=3.5,
        latencies_s=(0.01, latency_s),
        worker_check_ms=check_ms,
    )


def test_the_verdict_counts_the_worst_stop_and_the_worker_s_flag_read() -> None:
    assert figures(0.05).met  # 50 + 100 ms <= 70 + 200 ms
    assert not figures(0.2).met  # 200 + 100 ms > 270 ms
    assert not figures(0.05, check_ms=300).met
    assert "MISSED" in format_table(figures(0.2))


def test_a_tiny_run_stops_mid_llm_and_reports_every_figure() -> None:
    result = run_cancel_bench(BenchOptions(threads=1), stops=2, worker_check_ms=100.0)
    assert len(result.latencies_s) == 2 and all(0 < s < 5 for s in result.latencies_s)
    assert result.llm_step_s > 0 and result.cancel_at_s > 0
    data = json.loads(format_json(result))
    assert data["worst_s"] == max(data["latencies_s"]) and isinstance(data["met"], bool)
    assert "stop latency" in format_table(result)


def test_a_run_that_ends_before_its_flag_is_stopped_again_earlier(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run quicker than the timed one ends before its flag: the stop is tried again with the
    flag at half the time, and only after STOP_TRIES such runs does the bench give up."""
    tried: list[float] = []

    def third_run_stops(_engine: object, _request: object, after_s: float) -> float | None:
        tried.append(after_s)
        return 0.01 if len(tried) == 3 else None

    monkeypatch.setattr(cancel, "_stop_once", third_run_stops)
    assert cancel._one_stop(None, None, 0.8) == 0.01  # type: ignore[arg-type]
    assert tried == [0.8, 0.4, 0.2]

    tried.clear()
    monkeypatch.setattr(cancel, "_stop_once", lambda _e, _r, after_s: tried.append(after_s))
    with pytest.raises(SystemExit, match="ended before"):
        cancel._one_stop(None, None, 0.8)  # type: ignore[arg-type]
    assert len(tried) == cancel.STOP_TRIES
