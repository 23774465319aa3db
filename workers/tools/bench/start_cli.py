"""`cosyq-worker bench start`: process start -> worker ready, min and median of a few starts."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from shared.errors import SettingsError
from shared.settings import load_settings


def register_bench(commands: Any) -> None:
    start = commands.add_parser(
        "start",
        help="seconds from process start to a worker ready for jobs",
        description="Start `cosyq-worker run --burst` on an empty queue of a private "
        "redis-server N times (the configured engine; default model: the tiny one in a "
        "temporary folder) and print min, median and max of process start -> worker_ready.",
    )
    start.add_argument("--repeats", type=int, default=5, help="worker starts (default 5)")
    start.add_argument("--engine", help="module:factory (default COSYQ_ENGINE)")
    start.add_argument(
        "--model-dir",
        type=Path,
        help="default COSYQ_MODEL_DIR, else the tiny model written to a temporary folder",
    )
    start.add_argument("--json", action="store_true", help="print every figure as JSON")
    start.set_defaults(handler=run_start_bench)


def run_start_bench(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise SettingsError("--repeats must be >= 1")
    settings = load_settings()
    from workers.tools.bench import start  # noqa: PLC0415 (only when this benchmark runs)

    stats = start.run(
        args.engine or settings.engine, args.model_dir or settings.model_dir, args.repeats
    )
    print(json.dumps(stats.as_json()) if args.json else start.format_table(stats))
    return 0
