"""`cosyq-worker doctor [--model-dir DIR] [--quick] [--json]`: is this host ready?

Registering is cheap (nothing heavy imported); the checks import torch and the rest when the
command runs. Exit 0 when every required check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check this host (OS, stack, Redis, storage, model, Core ML) and measure each "
        "backend on the model",
        description="Checks in order: host, stack, services, model, then (unless --quick) the "
        "model through each backend on identical inputs. Attach `doctor --json` to a problem "
        "report.",
    )
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="the model directory (default: COSYQ_MODEL_DIR)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="checks only: no per-backend runs (seconds)"
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument(
        "--runs",
        type=int,
        default=3,
        help="timed calls per stage and syntheses per backend (default 3)",
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=50,
        help="speech tokens per synthesis, the same on every backend (default 50)",
    )
    parser.set_defaults(handler=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    if args.runs < 1 or args.tokens < 1:
        raise SystemExit("cosyq-worker doctor: --runs and --tokens must be at least 1")
    from shared.console import EXIT_BROKEN_PIPE  # noqa: PLC0415
    from shared.errors import SettingsError  # noqa: PLC0415
    from workers.service.host import (  # noqa: PLC0415
        limit_threads_before_load,
        physical_cores,
        threads_per_worker,
    )
    from workers.tools.doctor.checks import load_doctor_settings  # noqa: PLC0415

    settings = load_doctor_settings()
    if not isinstance(settings, SettingsError):  # measure with a worker's thread budget
        threads = threads_per_worker(settings.threads, settings.pool_size, physical_cores())
        limit_threads_before_load(threads, settings.pool_size)
    from workers.tools.doctor.checks import all_rows  # noqa: PLC0415 (torch from here on)
    from workers.tools.doctor.measure import RunOptions  # noqa: PLC0415
    from workers.tools.doctor.render import print_json, print_table  # noqa: PLC0415
    from workers.tools.doctor.rows import exit_status  # noqa: PLC0415

    options = RunOptions(runs=args.runs, tokens=args.tokens)
    rows = all_rows(settings, model_dir=args.model_dir, quick=args.quick, options=options)
    closed = print_json(rows) if args.json else print_table(rows)
    status = exit_status(rows)
    return EXIT_BROKEN_PIPE if closed and status == 0 else status  # `doctor | head`: 141
