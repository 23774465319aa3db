"""`cosyq-worker bench document`: a long document on 1 and 2 workers, its overhead against
plain jobs, and the assembly's peak memory (workers/tools/bench/document.py)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from shared.errors import SettingsError


def register_bench(commands: Any) -> None:
    document = commands.add_parser(
        "document",
        help="one document on 1 and 2 workers, overhead vs plain jobs, assembly peak RSS",
        description="On a private redis-server with the tiny model: wall time of one document "
        "on a pool of 1 and of 2 workers, the same segments as plain jobs, and the assembly "
        "alone of synthetic documents (peak RSS, which should not grow with the length).",
    )
    document.add_argument("--chars", type=int, default=6000, help="document length (6000)")
    document.add_argument(
        "--forced-tokens", type=int, default=8, help="speech tokens per piece (default 8)"
    )
    document.add_argument(
        "--assembly-minutes",
        default="10,60",
        help="lengths of the synthetic documents assembled, in minutes (default 10,60)",
    )
    document.add_argument(
        "--assembly-only", action="store_true", help="only the assembly figures (no model)"
    )
    document.add_argument("--json", action="store_true", help="print JSON (no table)")
    document.set_defaults(handler=run_bench_document)


def run_bench_document(args: argparse.Namespace) -> int:
    from workers.tools.bench.document import run_document_bench  # noqa: PLC0415

    try:
        minutes = [float(m) for m in args.assembly_minutes.split(",") if m.strip()]
    except ValueError as e:
        raise SettingsError("--assembly-minutes: numbers separated by commas") from e
    if args.chars < 100 or args.forced_tokens < 1 or not minutes or min(minutes) <= 0:
        raise SettingsError("--chars >= 100, --forced-tokens >= 1, --assembly-minutes > 0")
    report = run_document_bench(
        args.chars, args.forced_tokens, minutes, synthesis=not args.assembly_only
    )
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    for run in report.get("documents", []):
        print(f"document on {run['workers']} worker(s): {run['wall_s']:.1f} s wall, "
              f"{run['segments']} segments, {run['audio_s']:.1f} s of audio")  # fmt: skip
    if "plain_jobs" in report:
        plain = report["plain_jobs"]
        print(f"same segments as plain jobs on 1 worker: {plain['wall_s']:.1f} s wall")
        print(f"document overhead: {report['overhead_per_segment_s'] * 1000:.0f} ms per "
              f"segment, {report['overhead_share'] * 100:+.1f}% (target within 5%)")  # fmt: skip
    for run in report["assembly"]:
        print(f"assembly of {run['minutes']:g} min: peak RSS {run['peak_rss_mb']:.0f} MB, "
              f"{run['wall_s']:.1f} s (target under 200 MB)")  # fmt: skip
    print(f"load average {' '.join(f'{x:.2f}' for x in report['load_average'])}")
    return 0
