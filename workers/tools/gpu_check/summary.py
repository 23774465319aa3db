"""The GPU check's one JSON file: every step's own output, and the issue's figures on top.

Issue 47's field names: `device`, `torch`, `dtype`, `batch_audio_s_per_wall_s`,
`pool_audio_s_per_wall_s`, `vs_upstream_tts`, `stream_first_chunk_s`, `stream_first_chunk_s_c8`,
`recycle_ready_s`, `snr_db` (per dtype, per stage); `targets` says which the run met. A figure
whose step failed or did not run is null, never a guess.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

# Issue 47's targets: (figure, bound, "min" = at least / "max" = at most)
TARGETS: dict[str, tuple[float, str]] = {
    "batch_audio_s_per_wall_s": (100.0, "min"),
    "pool_audio_s_per_wall_s": (60.0, "min"),
    "vs_upstream_tts": (10.0, "min"),
    "stream_first_chunk_s": (0.150, "max"),
    "stream_first_chunk_s_c8": (0.400, "max"),
    "recycle_ready_s": (10.0, "max"),
    "flow_mel_snr_db": (30.0, "min"),
    "hift_wav_snr_db": (30.0, "min"),
}


@dataclass(frozen=True)
class StepResult:
    """What one step gave: its exit status, seconds, parsed JSON (if any) and output tail."""

    name: str
    rc: int | None  # None: timed out
    seconds: float
    data: Any = None
    tail: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def as_json(self) -> dict[str, Any]:
        seconds = round(self.seconds, 2)
        return {"rc": self.rc, "seconds": seconds, "data": self.data, "tail": self.tail}


def _data(steps: dict[str, StepResult], name: str) -> Any:
    step = steps.get(name)
    return step.data if step is not None and step.ok else None


def batch_figures(
    steps: dict[str, StepResult], name: str = "batch"
) -> tuple[float | None, int | None]:
    """The best audio s per wall s of `bench batch` (the step `name`) and the B that gave it."""
    data = _data(steps, name)
    rows = data.get("rows", []) if isinstance(data, dict) else []
    if not rows:
        return None, None
    best = max(rows, key=lambda row: row["throughput"])
    return float(best["throughput"]), int(best["batch_size"])


def stream_first_chunk(steps: dict[str, StepResult]) -> float | None:
    """Median first chunk after job start through a real queue and worker, else (no queue
    run) the engine's own streamed runs'."""
    data = _data(steps, "stream")
    if not isinstance(data, dict):
        return None
    queue = data.get("queue") or {}
    firsts = [job["first_from_start_s"] for job in queue.get("jobs", [])]
    if not firsts:
        firsts = [run["chunks"][0]["arrival_s"] for run in data.get("runs", []) if run["chunks"]]
    return float(statistics.median(firsts)) if firsts else None


def stage_snr(data: Any) -> dict[str, float]:
    """stage -> SNR (dB) against fp32 from one `bench --compare-fp32` (n/a stages left out)."""
    precision = (data.get("precision_vs_fp32") if isinstance(data, dict) else None) or {}
    return {
        stage: float(value)
        for stage, value in precision.items()
        if stage != "dtype" and isinstance(value, int | float)
    }


def snr_table(steps: dict[str, StepResult]) -> dict[str, dict[str, float]]:
    """dtype -> stage -> SNR (dB) against fp32, from each CosyVoice 2 `bench --compare-fp32`."""
    table = {}
    for name, step in steps.items():
        data = step.data if step.ok else None
        if name.startswith("bench_") and isinstance(data, dict):
            table[name.removeprefix("bench_")] = stage_snr(data)
    return table


def cosyvoice3_figures(steps: dict[str, StepResult]) -> dict[str, Any] | None:
    """CosyVoice 3's own figures (None when neither of its steps ran)."""
    if "cv3_bench" not in steps and "cv3_batch" not in steps:
        return None
    bench = _data(steps, "cv3_bench")
    batch, best_b = batch_figures(steps, "cv3_batch")
    return {
        "rtf": (bench.get("summary") or {}).get("rtf") if isinstance(bench, dict) else None,
        "snr_db": stage_snr(bench),
        "batch_audio_s_per_wall_s": batch,
        "best_batch_size": best_b,
    }


def upstream_best(upstream: Any) -> float | None:
    """Upstream's best audio s per wall s over its dtypes and `tts()` concurrencies."""
    if not isinstance(upstream, dict):
        return None
    best = None
    for result in (upstream.get("results") or {}).values():
        for entry in (result.get("concurrency") or {}).values():
            value = entry.get("audio_s_per_wall_s")
            if value is not None and (best is None or value > best):
                best = float(value)
    return best


def recycle_figure(pool: dict[str, Any], start: Any) -> float | None:
    """A recycled worker's start to ready with its batch session open (the pool's last fresh
    start: compiled code from the cache), else `bench start`'s median (to `worker_ready`)."""
    starts = pool.get("recycle_ready_s") or []
    if starts:
        return float(starts[-1])
    return start.get("median_s") if isinstance(start, dict) else None


def target_verdicts(figures: dict[str, float | None]) -> dict[str, dict[str, Any]]:
    verdicts = {}
    for name, (bound, kind) in TARGETS.items():
        value = figures.get(name)
        met = None if value is None else (value >= bound if kind == "min" else value <= bound)
        verdicts[name] = {"value": value, "target": bound, "kind": kind, "met": met}
    return verdicts


def summarize(
    steps: dict[str, StepResult], env: dict[str, Any], upstream: Any = None
) -> dict[str, Any]:
    """The check's JSON: environment, the issue's figures, target verdicts, every step."""
    batch, best_b = batch_figures(steps)
    pool = _data(steps, "pool")
    pool = pool if isinstance(pool, dict) else {}
    stream_c8 = (pool.get("stream") or {}).get("first_chunk_max_s")
    recycle = _data(steps, "recycle")
    snr = snr_table(steps)
    dtype = next(iter(snr), None)
    upstream_figure = upstream_best(upstream)
    reference = steps.get("check_reference")
    figures: dict[str, float | None] = {
        "batch_audio_s_per_wall_s": batch,
        "pool_audio_s_per_wall_s": pool.get("audio_s_per_wall_s"),
        "vs_upstream_tts": batch / upstream_figure if batch and upstream_figure else None,
        "stream_first_chunk_s": stream_first_chunk(steps),
        "stream_first_chunk_s_c8": stream_c8,
        "recycle_ready_s": recycle_figure(pool, recycle),
        "flow_mel_snr_db": snr.get(dtype or "", {}).get("flow_mel_db"),
        "hift_wav_snr_db": snr.get(dtype or "", {}).get("hift_wav_db"),
    }
    return {
        **env,
        "dtype": dtype,
        **{k: v for k, v in figures.items() if not k.endswith("_snr_db")},
        "best_batch_size": best_b,
        "snr_db": snr,
        "check_reference_passed": None if reference is None else reference.ok,
        "pool": pool or None,
        "upstream_best_audio_s_per_wall_s": upstream_figure,
        "upstream": upstream,
        "cosyvoice3": cosyvoice3_figures(steps),
        "targets": target_verdicts(figures),
        "steps": {name: step.as_json() for name, step in steps.items()},
    }
