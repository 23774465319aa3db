"""`cosyq-worker bench queue`: queue overhead against bare RQ, and the recycle cost."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

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
    queue.add_argument("--model-dir", type=Path, help="default COSYQ_MODEL_DIR")
    queue.set_defaults(handler=run_queue_bench)


def run_queue_bench(args: argparse.Namespace) -> int:
    from workers.tools.bench import queue  # noqa: PLC0415 (only when this benchmark runs)

    settings = load_settings()
    engine = args.engine or settings.engine
    model_dir = args.model_dir or settings.model_dir
    ours, bare, recycle = queue.run(engine, model_dir, args.jobs, args.repeats)
    print(queue.format_table(engine, ours, bare, recycle))
    return 0
