"""`cosyq-worker bench stream`: registers the command and prints its table (or `--json`)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from workers.tools.bench.cli import set_omp_wait_policy

FIRST_CHUNK_TARGET_S = 3.0
FIRST_CHUNK_SHARE = 0.15  # of the non-streaming job's time
TOTAL_SLACK = 0.15  # the stream's total within 15% of the non-streaming job
BACKLOG_FACTOR = 1.5  # first chunk behind a batch backlog: at most this times an idle worker's


def register_bench(commands: Any) -> None:
    from workers.tools.bench.cli import add_engine_arguments  # noqa: PLC0415

    stream = commands.add_parser(
        "stream",
        help="streaming: first chunk, chunk sizes, playback stalls, total vs non-streaming",
        description="Run one non-streaming and --jobs streamed syntheses of the same request "
        "on one loaded engine, then one streamed job through a real queue and worker; print "
        "first-chunk latency, each chunk's size and flow/HiFT cost, playback stalls, totals.",
    )
    add_engine_arguments(stream)
    stream.add_argument("--jobs", type=int, default=3, help="streamed runs (default 3)")
    stream.add_argument("--no-queue", action="store_true", help="skip the real-queue run")
    stream.add_argument(
        "--queue-jobs",
        type=int,
        default=2,
        help="streamed jobs of the same voice sent one after another to the worker (default 2)",
    )
    stream.add_argument(
        "--backlog-jobs",
        type=int,
        default=8,
        help="non-streamed jobs queued to a COSYQ_BATCH_SIZE=8 worker before one streamed job "
        "(queue.backlog; default 8, 0 skips it)",
    )
    stream.add_argument(
        "--compare-recompute",
        action="store_true",
        help="one more streamed run without the flow cache (every hop re-runs the prefix)",
    )
    stream.add_argument(
        "--align-prompt",
        action="store_true",
        help="as COSYQ_STREAM_ALIGN_PROMPT=true: the flow's prompt less its first P mod 25 "
        "tokens, so the first chunk has no pad (in process and in the workers)",
    )
    stream.add_argument("--json", action="store_true", help="print JSON instead of the table")
    stream.set_defaults(handler=run_stream_bench)


def run_stream_bench(args: argparse.Namespace) -> int:
    if args.jobs < 1 or args.queue_jobs < 1:
        raise SystemExit("cosyq-worker bench stream: --jobs and --queue-jobs must be at least 1")
    if args.backlog_jobs < 0:
        raise SystemExit("cosyq-worker bench stream: --backlog-jobs must be 0 or more")
    set_omp_wait_policy(args.omp_wait_policy)
    from workers.tools.bench import stream_bench  # noqa: PLC0415 (torch only when it runs)
    from workers.tools.bench.engine_bench import BenchOptions  # noqa: PLC0415

    options = BenchOptions.from_args(args)
    result = stream_bench.run(
        options,
        jobs=args.jobs,
        through_queue=not args.no_queue,
        compare_recompute=args.compare_recompute,
        queue_jobs=args.queue_jobs,
        backlog_jobs=args.backlog_jobs,
        align_prompt=args.align_prompt,
    )
    print(json.dumps(asdict(result)) if args.json else format_table(result))
    return 0


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


CHUNK_COLUMNS = "arrival, audio, flow s, flow s per audio s, HiFT s, (flow+HiFT)/audio"


def _chunk_lines(run: Any) -> list[str]:
    """One line per chunk: its arrival, audio, flow and HiFT seconds and their cost ratios."""
    lines, audio_end = [], 0.0
    for chunk, stall in zip(run.chunks, run.stalls(), strict=True):
        seconds = chunk.samples / run.sample_rate
        audio_end += seconds
        flow = chunk.flow_s / seconds if seconds else 0.0
        cost = (chunk.flow_s + chunk.hift_s) / seconds if seconds else 0.0
        lines.append(
            f"  {chunk.arrival_s:>7.2f} s  {seconds:>5.2f} s (to {audio_end:>5.2f})  "
            f"{chunk.flow_s:>6.2f} s  {flow:>5.2f}  {chunk.hift_s:>5.2f} s  {cost:>5.2f}"
            + (f"  stall {stall:.2f} s" if stall > 0 else "")
        )
    return lines


def format_table(result: Any) -> str:
    base = result.nonstream_s
    lines = [
        f"bench stream: {result.model}, forced tokens {result.tokens}, "
        f"load average {result.load_average[0]:.1f} -> {result.load_average[1]:.1f}"
        + (", prompt aligned to the flow's chunks" if result.align_prompt else ""),
        f"non-streaming job: {base:.2f} s",
        "",
        "run  first chunk  (share)  last chunk  total (vs non-stream)  chunks  stalls",
    ]
    for index, run in enumerate(result.runs, 1):
        stalls = run.stalls()
        lines.append(
            f"{index:>3}  {run.first_chunk_s:>9.2f} s  {run.first_chunk_s / base:>6.1%}  "
            f"{run.last_chunk_s:>8.2f} s  {run.total_s:>7.2f} s ({run.total_s / base - 1:+.1%})"
            f"  {len(run.chunks):>6}  {sum(stalls):.2f} s"
        )
    lines += ["", f"chunks of run {len(result.runs)}: {CHUNK_COLUMNS}"]
    lines += _chunk_lines(result.runs[-1])
    if result.recompute is not None:
        lines += ["", f"chunks without the flow cache (prefix re-run per hop): {CHUNK_COLUMNS}"]
        lines += _chunk_lines(result.recompute)
    worst_first = max(run.first_chunk_s for run in result.runs)
    worst_total = max(run.total_s for run in result.runs)
    over = worst_total / base - 1
    ahead = all(sum(run.stalls()) == 0 for run in result.runs)
    lines += [
        "",
        f"target first chunk <= {FIRST_CHUNK_TARGET_S:g} s (every run): "
        f"{_verdict(worst_first <= FIRST_CHUNK_TARGET_S)} (worst {worst_first:.2f} s)",
        f"target first chunk <= {FIRST_CHUNK_SHARE:.0%} of non-streaming: "
        f"{_verdict(worst_first <= FIRST_CHUNK_SHARE * base)} (worst {worst_first / base:.1%})",
        f"target total within {TOTAL_SLACK:.0%} of non-streaming: "
        f"{_verdict(over <= TOTAL_SLACK)} (worst {over:+.1%})",
        f"stream stays ahead of playback: {'yes' if ahead else 'no'}",
    ]
    if result.queue is not None:
        lines += ["", "through the queue (one worker, same voice, one job after another):"]
        for index, q in enumerate(result.queue.jobs, 1):
            start = "n/a" if q.first_from_start_s is None else f"{q.first_from_start_s:.2f} s"
            lines.append(
                f"  job {index}: first chunk {q.first_from_submit_s:.2f} s after submit "
                f"({start} after job start, queue wait {q.queue_wait_s:.2f} s), "
                f"last {q.last_from_submit_s:.2f} s, {q.chunks} entries{_stages(q)}"
            )
        lines += _backlog_lines(result.queue)
    return "\n".join(lines)


def _backlog_lines(queue: Any) -> list[str]:
    """The streamed job behind a batch backlog against the idle worker's last job."""
    backlog, idle = queue.backlog, queue.jobs[-1]
    if backlog is None:
        return []
    lines = [""]
    primer = getattr(queue, "backlog_primer", None)
    if primer is not None:
        lines.append(
            "a COSYQ_BATCH_SIZE=8 worker's first streamed job of the voice, idle (keeps its "
            f"prefix): first chunk {_seconds(primer.first_from_start_s)} after job start"
        )
    lines += [
        f"behind a backlog ({queue.backlog_jobs} non-streamed jobs queued to that worker first):",
        f"  first chunk {backlog.first_from_submit_s:.2f} s after submit "
        f"({_seconds(backlog.first_from_start_s)} after job start), "
        f"last {backlog.last_from_submit_s:.2f} s, {backlog.chunks} entries{_stages(backlog)}",
    ]
    if backlog.first_from_start_s is not None and idle.first_from_start_s is not None:
        ratio = backlog.first_from_start_s / idle.first_from_start_s
        lines.append(
            f"target first chunk behind a backlog <= {BACKLOG_FACTOR:g}x an idle worker's "
            f"(job start to first chunk): {_verdict(ratio <= BACKLOG_FACTOR)} ({ratio:.2f}x)"
        )
    return lines


def _stages(figures: Any) -> str:
    """The job's model seconds per stage, as its result reports them."""
    stages = getattr(figures, "stage_s", None) or {}
    shown = [f"{name} {stages[name]:.2f}" for name in ("llm", "flow", "hift") if name in stages]
    return f"; model s: {', '.join(shown)}" if shown else ""


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"
