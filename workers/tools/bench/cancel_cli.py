"""`cosyq-worker bench cancel`: a running request's stop latency once canceled, mid-LLM
(workers/tools/bench/cancel.py)."""

from __future__ import annotations

import argparse
from typing import Any


def register_bench(commands: Any) -> None:
    from workers.tools.bench.cli import add_engine_arguments  # noqa: PLC0415 (cli imports us)

    cancel = commands.add_parser(
        "cancel",
        help="how long a running request takes to stop once canceled (mid-LLM)",
        description="One uncanceled run for the LLM's pace, then --stops runs whose stop flag "
        "is set halfway through the LLM; prints the flag-to-stop latency against issue 24's "
        "target (one LLM step + 0.2 s, with the worker's COSYQ_CANCEL_CHECK_MS added).",
    )
    add_engine_arguments(cancel)
    cancel.add_argument("--stops", type=int, default=3, help="canceled runs (default 3)")
    cancel.add_argument("--json", action="store_true", help="print JSON (no table)")
    cancel.set_defaults(handler=run_bench_cancel)


def run_bench_cancel(args: argparse.Namespace) -> int:
    from workers.tools.bench.cli import set_omp_wait_policy  # noqa: PLC0415

    if args.stops < 1:
        raise SystemExit("cosyq-worker bench cancel: --stops must be at least 1")
    set_omp_wait_policy(args.omp_wait_policy)
    from shared.settings import Settings  # noqa: PLC0415
    from workers.tools.bench.cancel import format_json, format_table, run_cancel_bench  # noqa: PLC0415
    from workers.tools.bench.engine_bench import BenchOptions  # noqa: PLC0415

    check_ms = float(Settings.model_fields["cancel_check_ms"].default)
    figures = run_cancel_bench(
        BenchOptions.from_args(args), stops=args.stops, worker_check_ms=check_ms
    )
    print(format_json(figures) if args.json else format_table(figures))
    return 0
