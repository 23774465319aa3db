"""`cosyq-worker bench tenants`: fair share through a real worker
(workers/tools/bench/tenants.py)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register_bench(commands: Any) -> None:
    tenants = commands.add_parser(
        "tenants",
        help="fair share: alpha's backlog, then beta's jobs; when beta's are taken",
        description="On a private redis-server with the tiny model: tenant alpha queues "
        "--alpha-jobs, then beta --beta-jobs, then one worker starts; prints the positions at "
        "which beta's jobs were taken against beta-jobs x 2 + batch size, per batch size.",
    )
    tenants.add_argument("--alpha-jobs", type=int, default=200, help="alpha's backlog (200)")
    tenants.add_argument("--beta-jobs", type=int, default=5, help="beta's jobs (5)")
    tenants.add_argument("--batch-sizes", default="1,8", help="COSYQ_BATCH_SIZE values (1,8)")
    tenants.add_argument(
        "--forced-tokens", type=int, default=8, help="speech tokens per piece (default 8)"
    )
    tenants.add_argument("--json", action="store_true", help="print JSON (no table)")
    tenants.set_defaults(handler=run_bench_tenants)


def run_bench_tenants(args: argparse.Namespace) -> int:
    from workers.tools.bench.tenants import format_table, run_tenants_bench  # noqa: PLC0415

    try:
        sizes = [int(size) for size in args.batch_sizes.split(",")]
    except ValueError:
        bad = args.batch_sizes
        raise SystemExit(f"cosyq-worker bench tenants: --batch-sizes {bad!r}") from None
    if min(sizes) < 1 or args.alpha_jobs < 0 or args.beta_jobs < 1:
        raise SystemExit("cosyq-worker bench tenants: sizes and --beta-jobs must be at least 1")
    report = run_tenants_bench(args.alpha_jobs, args.beta_jobs, sizes, args.forced_tokens)
    print(json.dumps(report, indent=2, default=str) if args.json else format_table(report))
    return 0
