"""`cosyq-worker bench --json`: every figure of the printed tables, as one JSON document."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from typing import Any

from workers.tools.bench.engine_bench import QUALITY_SHARE_TARGET, BenchResult, RunFigures
from workers.tools.bench.report import ours, stage_floors


def _run(run: RunFigures) -> dict[str, Any]:
    return {**asdict(run), "ms_per_token": run.ms_per_token}


def _stages(result: BenchResult) -> dict[str, dict[str, Any]]:
    floors = stage_floors(result)
    stages: dict[str, dict[str, Any]] = {}
    for stage in ("frontend", "llm", "flow", "hift"):
        mean = result.stage_mean(stage)
        entry: dict[str, Any] = {"s": mean, "precision": result.precisions.get(stage)}
        if stage in floors:
            timed = mean - result.first_token_s if stage == "llm" else mean
            entry.update(floor_s=floors[stage], x_floor=timed / floors[stage])
        stages[stage] = entry
    stages["llm"].update(
        ms_per_token=result.ms_per_token,
        first_token_s=result.first_token_s,
        prefill_positions=result.prefill_positions,
    )
    if result.floors is not None:
        stages["llm"]["floor_ms_per_token"] = result.floors.llm_ms_per_token
    stages["quality"] = {
        "s": result.quality_s,
        "share": result.quality_share,
        "target_share": QUALITY_SHARE_TARGET,
        "met": result.quality_share < QUALITY_SHARE_TARGET,
    }
    return stages


def format_json(result: BenchResult) -> str:
    o = result.options
    doc = {
        "model": result.model,
        "device": result.device,
        "dtype": o.dtype,
        "threads": o.threads,
        "config": o.config,
        "family": o.family,
        "load_average": list(result.load_average),
        "omp_wait_policy": result.omp_wait_policy,
        "cpu": result.host.as_json(),
        "precisions": result.precisions,
        "summary": {
            **ours(result),
            "voice_s": result.voice_s,
            "first_s": result.first.wall_s,
            "mean_s": result.mean_s,
            "p95_s": result.p95_s,
            "audio_s": result.audio_s,
            "rss_after_load_gb": result.rss_after_load_gb,
        },
        "stages": _stages(result),
        "floors": result.floors.as_json() if result.floors is not None else None,
        "first": _run(result.first),
        "runs": [_run(r) for r in result.runs],
        "precision_vs_fp32": asdict(result.precision) if result.precision is not None else None,
    }
    return json.dumps(_finite(doc))


def _finite(value: Any) -> Any:
    """JSON has no Infinity: an identical output's SNR (inf) is written as the string "inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
