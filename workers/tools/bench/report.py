"""The engine bench's printed tables, and upstream's figures and our targets beside ours."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from workers.tools.bench.engine_bench import QUALITY_SHARE_TARGET, BenchResult


@dataclass(frozen=True)
class Target:
    """One row of the engine bench's table: upstream on this kind of machine and our target."""

    measure: str
    upstream: float
    target: float


# Full size, random weights, fp32, 2 threads, stop ids masked to force 100 tokens.
TARGETS = {
    "ms_per_token": Target("LLM per token, batch 1 (ms)", 122.7, 55.0),
    "prefill_s": Target("LLM prefill (s)", 0.41, 0.3),
    "flow_s": Target("flow, 100 + 50 prompt tokens (s)", 6.38, 5.0),
    "hift_s": Target("HiFT, 200 frames (s)", 0.47, 0.45),
    "rtf": Target("whole chain RTF, 4 s utterance", 4.88, 2.4),
    "load_s": Target("model load, warm page cache (s)", 3.4, 2.0),
    "peak_rss_gb": Target("peak RSS after load (GB)", 4.96, 3.0),
}


def _rows(rows: Sequence[tuple[str, ...]], *, text_last: bool = False) -> list[str]:
    """Aligned columns: the first left, numbers right, a last text column left."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    last = len(widths) - 1

    def cell(i: int, value: str) -> str:
        left = i == 0 or (text_last and i == last)
        return value.ljust(widths[i]) if left else value.rjust(widths[i])

    return ["  ".join(cell(i, v) for i, v in enumerate(row)).rstrip() for row in rows]


FULL_ARCHITECTURES = {"cosyvoice2": "CosyVoice2-0.5B", "cosyvoice3": "Fun-CosyVoice3-0.5B"}


def headline(result: BenchResult) -> list[str]:
    o = result.options
    if o.model_dir is not None:
        source = f"{o.model_dir} ({result.model})"
    elif o.config == "full-random":
        source = f"full-random ({FULL_ARCHITECTURES[o.family]} architecture, random weights)"
    else:
        source = f"tiny {o.family} (random weights)"
    forced = result.runs[0].speech_tokens if o.tokens or o.config == "full-random" else None
    tokens = f"{forced} speech tokens forced" if forced else "natural length"
    return [
        f"cosyq-worker bench: {source}, torch {result.device} {o.dtype}, {o.threads} threads",
        f"text: {len(o.text)} chars, {result.runs[0].pieces} piece(s), {tokens}; "
        f"{len(result.runs)} timed runs after a first one, seed {o.seed}",
        f"OMP_WAIT_POLICY={result.omp_wait_policy}; load average {result.load_average[0]:.2f} "
        f"before, {result.load_average[1]:.2f} after, on {os.cpu_count()} CPUs",
        result.host.line(),
        "precision per stage: " + ", ".join(f"{k} {v}" for k, v in result.precisions.items()),
    ]


def summary_table(result: BenchResult) -> list[str]:
    r = result
    rows = [
        ("measure", "value"),
        ("model load s", f"{r.load_s:.2f}"),
        ("voice extraction s (prompt.wav)", f"{r.voice_s:.3f}"),
        ("first inference s", f"{r.first.wall_s:.3f}"),
        ("mean inference s", f"{r.mean_s:.3f}"),
        ("p95 inference s", f"{r.p95_s:.3f}"),
        ("audio s", f"{r.audio_s:.2f}"),
        ("RTF (mean / audio)", f"{r.rtf:.3f}"),
        ("RSS after load GB (mapped weights untouched)", f"{r.rss_after_load_gb:.2f}"),
        ("peak RSS GB", f"{r.peak_rss_gb:.2f}"),
    ]
    return _rows(rows)


def stage_table(result: BenchResult) -> list[str]:
    """Per stage: mean seconds, the floor on this machine and how many times it we run."""
    r = result
    tokens, pieces = r.runs[0].speech_tokens, r.runs[0].pieces
    per_s = 1e3 / r.ms_per_token if r.ms_per_token > 0 else 0.0
    floor = stage_floors(r)
    rows = [
        ("stage (mean per run)", "s", "floor s", "x floor", "detail"),
        ("frontend", f"{r.stage_mean('frontend'):.3f}", "-", "-", "normalise, split, tokenize"),
        (
            "LLM",
            f"{r.stage_mean('llm'):.3f}",
            *_floor_cells(floor.get("llm"), r.stage_mean("llm") - r.first_token_s),
            f"{tokens} tokens; first token {r.first_token_s:.3f} s "
            f"({r.prefill_positions} positions prefilled); {r.ms_per_token:.1f} ms/token "
            f"= {per_s:.1f} tokens/s" + _decode_floor(r),
        ),
        (
            "flow",
            f"{r.stage_mean('flow'):.3f}",
            *_floor_cells(floor.get("flow"), r.stage_mean("flow")),
            f"{2 * tokens} mel frames + prompt" + _flow_detail(r),
        ),
        (
            "HiFT",
            f"{r.stage_mean('hift'):.3f}",
            *_floor_cells(floor.get("hift"), r.stage_mean("hift")),
            f"{2 * tokens} frames -> {r.audio_s:.2f} s"
            + (f"; {r.floors.hift_gflop * pieces:.1f} GFLOP" if r.floors else ""),
        ),
        (
            "quality",
            f"{r.quality_s:.4f}",
            "-",
            "-",
            f"measures + verdict: {r.quality_share:.3%} of each run's wall time "
            f"(target under {QUALITY_SHARE_TARGET:.0%}: "
            f"{'met' if r.quality_share < QUALITY_SHARE_TARGET else 'missed'})",
        ),
    ]
    return _rows(rows, text_last=True)


def stage_floors(result: BenchResult) -> dict[str, float]:
    """Floor seconds per run: the LLM's decode (tokens after each piece's first), flow, HiFT."""
    f, run = result.floors, result.runs[0]
    if f is None:
        return {}
    decoded = run.speech_tokens - run.pieces
    return {
        "llm": f.llm_ms_per_token * decoded / 1e3,
        "flow": f.flow_s * run.pieces,
        "hift": f.hift_s * run.pieces,
    }


def _floor_cells(floor: float | None, ours: float) -> tuple[str, str]:
    if floor is None or floor <= 0:
        return "-", "-"
    return f"{floor:.3f}", f"{ours / floor:.2f}"


def _decode_floor(r: BenchResult) -> str:
    if r.floors is None:
        return ""
    f = r.floors
    return (
        f"; decode floor {f.llm_ms_per_token:.1f} ms/token = {f.llm_bytes_per_step / 1e9:.2f} GB "
        f"per step / {f.bandwidth_gbs:.1f} GB/s (x floor: decode only)"
    )


def _flow_detail(r: BenchResult) -> str:
    if r.floors is None:
        return ""
    f, ops = r.floors, r.floors.flow_ops
    return (
        f"; {f.flow_gflop * r.runs[0].pieces:.1f} GFLOP at "
        f"{f.gemm_gflops[r.precisions['flow']]:.0f} GFLOP/s; not matrix products "
        f"{ops.not_matmul:.0%} (attention {ops.attention:.0%}, other ops {ops.other_ops:.0%}, "
        f"between ops {ops.outside_ops:.0%})"
    )


def floor_lines(result: BenchResult) -> list[str]:
    f = result.floors
    if f is None:
        return ["floors: not measured (--no-floors, or not a CPU run)"]
    rates = ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in f.gemm_gflops.items())
    return [
        f"machine (best of a few, so load only lowers them): memory bandwidth "
        f"{f.bandwidth_gbs:.1f} GB/s (sum over 512 MB); GEMM 1024^3: {rates}"
    ]


def ours(result: BenchResult) -> dict[str, float]:
    return {
        "ms_per_token": result.ms_per_token,
        "prefill_s": result.first_token_s,
        "flow_s": result.stage_mean("flow"),
        "hift_s": result.stage_mean("hift"),
        "rtf": result.rtf,
        "load_s": result.load_s,
        "peak_rss_gb": result.peak_rss_gb,
    }


def verdict(value: float, target: float) -> str:
    change = value / target - 1
    if value <= target:
        return f"met, {-change:.0%} under"
    return f"missed, {change:.0%} over"


def target_table(result: BenchResult) -> list[str]:
    o = result.options
    title = f"engine bench (targets: fp32, 2 threads; ours: {o.dtype}, {o.threads} threads)"
    rows = [(title, "upstream", "target", "ours", "")]
    for key, value in ours(result).items():
        t = TARGETS[key]
        rows.append(
            (
                t.measure,
                f"{t.upstream:g}",
                f"{t.target:g}",
                f"{value:.3g}",
                verdict(value, t.target),
            )
        )
    return _rows(rows, text_last=True)


def format_report(result: BenchResult) -> str:
    parts = [*headline(result), "", *summary_table(result), "", *stage_table(result)]
    parts += floor_lines(result)
    o = result.options
    if o.config == "full-random" and o.model_dir is None and o.family == "cosyvoice2":
        parts += ["", *target_table(result)]  # the targets are CosyVoice 2's
    if result.precision is not None:
        parts += ["", *result.precision.lines()]
    return "\n".join(parts)
