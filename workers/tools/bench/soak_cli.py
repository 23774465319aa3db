"""`cosyq-worker bench soak`: many varied jobs through a recycling pool; nothing lost."""

from __future__ import annotations

import argparse
import json
from typing import Any


def register_bench(commands: Any) -> None:
    soak = commands.add_parser(
        "soak",
        help="N varied jobs (some bad) through a recycling pool: lost must be 0",
        description="Start a private redis-server and `cosyq-worker pool` on the tiny model, "
        "submit N jobs of every mode and format (some with a registered voice, some bad on "
        "purpose), wait for all, and print finished / failed / lost, recycles, each worker's "
        "RSS after its first and last job, and throughput. Exit 1 unless failed == bad and "
        "lost == 0.",
    )
    soak.add_argument("--jobs", type=int, default=1000, help="jobs to submit (default 1000)")
    soak.add_argument("--pool", type=int, default=2, help="worker slots (default 2)")
    soak.add_argument(
        "--max-jobs", type=int, default=50, help="COSYQ_MAX_JOBS for the workers (default 50)"
    )
    soak.add_argument(
        "--bad-every", type=int, default=20, help="every Nth job is bad (default 20: 5%%)"
    )
    soak.add_argument("--seed", type=int, default=0)
    soak.add_argument("--json", action="store_true", help="print only the JSON summary")
    soak.set_defaults(handler=run_soak_bench)


def run_soak_bench(args: argparse.Namespace) -> int:
    from workers.tools.bench.soak import SoakOptions, run_soak  # noqa: PLC0415
    from workers.tools.bench.soak_report import format_report  # noqa: PLC0415

    if args.jobs < 1 or args.pool < 1 or args.max_jobs < 1 or args.bad_every < 0:
        raise SystemExit("cosyq-worker bench soak: --jobs, --pool, --max-jobs must be >= 1")
    options = SoakOptions(
        jobs=args.jobs,
        pool=args.pool,
        max_jobs=args.max_jobs,
        bad_every=args.bad_every,
        seed=args.seed,
    )
    report = run_soak(options)
    print(json.dumps(report.as_json()) if args.json else format_report(report))
    return 0 if report.failed == report.bad and report.lost == 0 else 1
