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
    print(json.dumps(report, indent=1) if args.json else "\n".join(format_table(report)))
    return 0


DOCUMENT_HEADER = ("workers", "segments", "audio s", "document s", "plain jobs s", "ms/segment")
ASSEMBLY_HEADER = ("assembly", "segments", "peak RSS MB", "wall s")


def format_table(report: dict[str, Any]) -> list[str]:
    """The report as lines: the host, a row per pool size, the assembly, each target's verdict."""
    from workers.tools.bench.report import _rows  # noqa: PLC0415 (torch: not at registration)

    share, rss = report["targets"]["overhead_share"], report["targets"]["assembly_peak_rss_mb"]
    before, after = report["load_average_before"], report["load_average"]
    lines = [
        f"cosyq-worker bench document: CPU {report['cpu']['model']}, "
        f"{report['cpu']['cores']} cores; load average {before[0]:.2f} before, "
        f"{after[0]:.2f} after ({' '.join(f'{x:.2f}' for x in after)})"
    ]
    if report.get("documents"):
        lines.append(f"document of {report['document_chars']} chars, tiny model:")
        header = (*DOCUMENT_HEADER, "overhead", f"target within {share:.0%}")
        lines += _rows([header] + [_document_row(run, share) for run in report["documents"]])
        lines.append(f"2 workers over 1 (document): {report['speed_up_2_over_1']:.2f}x")
    assembly = (*ASSEMBLY_HEADER, f"target under {rss:g} MB")
    lines += _rows([assembly] + [_assembly_row(run, rss) for run in report["assembly"]])
    return lines


def _document_row(run: dict[str, Any], target: float) -> tuple[str, ...]:
    share = run["overhead_share"]
    return (
        str(run["workers"]),
        str(run["segments"]),
        f"{run['audio_s']:.1f}",
        f"{run['wall_s']:.1f}",
        f"{run['plain_wall_s']:.1f}",
        f"{run['overhead_per_segment_s'] * 1000:.0f}",
        f"{share:+.1%}",
        "met" if share <= target else "missed",  # faster than plain jobs: noise, not a cost
    )


def _assembly_row(run: dict[str, Any], target_mb: float) -> tuple[str, ...]:
    return (
        f"{run['minutes']:g} min",
        str(run["segments"]),
        f"{run['peak_rss_mb']:.0f}",
        f"{run['wall_s']:.1f}",
        "met" if run["peak_rss_mb"] < target_mb else "missed",
    )
