"""`cosyq-worker bench queue`: queue overhead against bare RQ, and the recycle cost; with
`--via http`, what the HTTP front adds over a direct submit (workers/bench/http_front.py)."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from typing import Any

from shared.errors import SettingsError
from shared.settings import load_settings


def register_bench(commands: Any) -> None:
    queue = commands.add_parser(
        "queue",
        help="jobs/s and per-job overhead vs bare RQ, recycle cost",
        description="Run N jobs through `cosyq-worker run` (the configured engine) and N no-op "
        "jobs through a stock RQ SimpleWorker on a private redis-server; print jobs/s, "
        "per-job overhead (wall - synthesis), their ratio, and process start -> worker_ready.",
    )
    queue.add_argument("--jobs", type=int, default=200, help="jobs per run (default 200)")
    queue.add_argument("--repeats", type=int, default=3, help="recycle samples (default 3)")
    queue.add_argument("--engine", help="module:factory (default COSYQ_ENGINE)")
    queue.add_argument(
        "--model-dir",
        type=Path,
        help="default COSYQ_MODEL_DIR, else the tiny model written to a temporary folder",
    )
    queue.add_argument(
        "--batch-size",
        type=int,
        help="jobs in flight in the worker (COSYQ_BATCH_SIZE; default: the setting)",
    )
    queue.add_argument(
        "--via",
        choices=["rq", "http"],
        default="rq",
        help="rq (default): against bare RQ; http: `cosyq serve` against a direct submit",
    )
    queue.add_argument(
        "--e2e-jobs", type=int, default=30, help="--via http: end-to-end jobs per path (30)"
    )
    queue.add_argument(
        "--concurrency", type=int, default=8, help="--via http: client threads (default 8)"
    )
    queue.add_argument("--json", action="store_true", help="--via http: print JSON, no table")
    queue.set_defaults(handler=run_queue_bench)


def run_queue_bench(args: argparse.Namespace) -> int:
    settings = load_settings()
    engine = args.engine or settings.engine
    model_dir = args.model_dir or settings.model_dir
    if min(args.jobs, args.e2e_jobs, args.concurrency, args.repeats) < 1:
        raise SettingsError("--jobs, --e2e-jobs, --concurrency and --repeats must be >= 1")
    if args.batch_size is not None and not 1 <= args.batch_size <= 16:
        raise SettingsError("--batch-size must be between 1 and 16 (COSYQ_BATCH_SIZE's range)")
    if args.via == "http":
        return run_http_bench(args, engine, model_dir)
    from workers.tools.bench import queue  # noqa: PLC0415 (only when this benchmark runs)

    batch_size = args.batch_size or settings.batch_size
    ours, bare, recycle = queue.run(engine, model_dir, args.jobs, args.repeats, batch_size)
    print(queue.format_table(engine, ours, bare, recycle))
    return 0


def run_http_bench(args: argparse.Namespace, engine: str, model_dir: Path | None) -> int:
    missing = [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]
    if missing:
        raise SettingsError(f"bench queue --via http needs cosyq[http] ({', '.join(missing)})")
    from workers.tools.bench import http_front  # noqa: PLC0415 (only when this benchmark runs)

    result = http_front.run(engine, model_dir, args.jobs, args.e2e_jobs, args.concurrency)
    if args.json:
        print(json.dumps(result.as_json()))
    else:
        print(http_front.format_table(result))
    return 0
