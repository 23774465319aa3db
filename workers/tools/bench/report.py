"""The engine bench's printed tables, and issue 4's upstream figures and targets beside ours."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from workers.tools.bench.engine_bench import BenchResult


@dataclass(frozen=True)
class Target:
    """One row of issue 4's table: upstream on this kind of machine and our target."""

    measure: str
    upstream: float
    target: float


# Full size, random weights, fp32, 2 threads, stop ids masked to force 100 tokens (issue 4).
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


def headline(result: BenchResult) -> list[str]:
    o = result.options
    if o.model_dir is not None:
        source = f"{o.model_dir} ({result.model})"
    elif o.config == "full-random":
        source = "full-random (CosyVoice2-0.5B architecture, random weights)"
    else:
        source = "tiny (random weights)"
    forced = result.runs[0].speech_tokens if o.tokens or o.config == "full-random" else None
    tokens = f"{forced} speech tokens forced" if forced else "natural length"
    return [
        f"cosyq-worker bench: {source}, torch {result.device} {o.dtype}, {o.threads} threads",
        f"text: {len(o.text)} chars, {result.runs[0].pieces} piece(s), {tokens}; "
        f"{len(result.runs)} timed runs after a first one, seed {o.seed}",
        f"OMP_WAIT_POLICY={result.omp_wait_policy}; load average {result.load_average[0]:.2f} "
        f"before, {result.load_average[1]:.2f} after, on {os.cpu_count()} CPUs",
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
    r = result
    tokens = r.runs[0].speech_tokens
    per_s = 1e3 / r.ms_per_token if r.ms_per_token > 0 else 0.0
    rows = [
        ("stage (mean per run)", "s", "detail"),
        ("frontend", f"{r.stage_mean('frontend'):.3f}", "normalise, split, tokenize"),
        (
            "LLM",
            f"{r.stage_mean('llm'):.3f}",
            f"{tokens} tokens; first token {r.first_token_s:.3f} s "
            f"({r.prefill_positions} positions prefilled); {r.ms_per_token:.1f} ms/token "
            f"= {per_s:.1f} tokens/s",
        ),
        ("flow", f"{r.stage_mean('flow'):.3f}", f"{2 * tokens} mel frames + prompt"),
        ("HiFT", f"{r.stage_mean('hift'):.3f}", f"{2 * tokens} frames -> {r.audio_s:.2f} s"),
    ]
    return _rows(rows, text_last=True)


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
    title = f"issue 4 (targets: fp32, 2 threads; ours: {o.dtype}, {o.threads} threads)"
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
    if result.options.config == "full-random" and result.options.model_dir is None:
        parts += ["", *target_table(result)]
    if result.precision is not None:
        parts += ["", *result.precision.lines()]
    return "\n".join(parts)
