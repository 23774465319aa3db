"""`cosyq-worker model ...`: write the tiny model, check parity against a reference set."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("model", help="model directory tools")
    commands = parser.add_subparsers(dest="model_command", required=True, metavar="COMMAND")

    tiny = commands.add_parser(
        "init-tiny", help="write a tiny random-weight model in the official CosyVoice2-0.5B layout"
    )
    tiny.add_argument("directory", type=Path)
    tiny.add_argument("--seed", type=int, default=0, help="weights and ONNX stand-ins seed")
    tiny.add_argument(
        "--family",
        choices=("cosyvoice2", "cosyvoice3"),
        default="cosyvoice2",
        help="model family: CosyVoice2-0.5B (default) or Fun-CosyVoice3-0.5B layout",
    )
    tiny.set_defaults(handler=_init_tiny)

    check = commands.add_parser(
        "check-reference", help="compare our stages with an official reference set"
    )
    check.add_argument(
        "directory",
        type=Path,
        help="a folder in the cosyvoice2-reference or cosyvoice3-reference format (the family "
        "is read from its config.json)",
    )
    check.add_argument("--device", default="cpu", help="torch device (cpu, mps, cuda)")
    check.add_argument(
        "--stages",
        default=None,
        help="comma-separated subset; CosyVoice 2 sets: llm, flow, stream (the engine's chunked "
        "streaming flow), hift, features; CosyVoice 3 sets: llm, flow, hift, session (flow + "
        "HiFT in the official streaming schedule), features (default: all)",
    )
    check.set_defaults(handler=_check_reference)


def _init_tiny(args: argparse.Namespace) -> int:
    if args.directory.exists() and not args.directory.is_dir():
        print(
            f"cosyq-worker model init-tiny: {args.directory} is a file, not a folder",
            file=sys.stderr,
        )
        return 2
    try:  # the folder first: one that cannot be made is refused before torch's import (~2 s)
        args.directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        return _cannot_write(args.directory, e)

    from workers.tools.fixtures.tiny import write_tiny_model  # noqa: PLC0415 (torch only when run)
    from workers.tools.fixtures.tiny3 import write_tiny3_model  # noqa: PLC0415

    try:
        writer = write_tiny3_model if args.family == "cosyvoice3" else write_tiny_model
        directory = writer(args.directory, seed=args.seed)
    except OSError as e:
        return _cannot_write(args.directory, e)
    name = "CosyVoice 3" if args.family == "cosyvoice3" else "CosyVoice 2"
    print(f"wrote a tiny {name} model (random weights, seed {args.seed}) to {directory.root}")
    print(f"use it with: COSYQ_MODEL_DIR={directory.root.resolve()}")
    return 0


def _cannot_write(directory: Path, e: OSError) -> int:
    inner = f": {e.filename}" if e.filename and str(e.filename) != str(directory) else ""
    print(
        f"cosyq-worker model init-tiny: cannot write {directory} ({e.strerror or e}{inner})",
        file=sys.stderr,
    )
    return 2


def _check_reference(args: argparse.Namespace) -> int:
    import torch  # noqa: PLC0415 (torch only when run)

    from workers.tools.reference.check import (  # noqa: PLC0415
        family_checks,
        missing_files,
        run_reference_checks,
    )
    from workers.tools.reference.parity import ReferenceSet  # noqa: PLC0415

    ref = ReferenceSet(args.directory)
    if not ref.has("config.json"):
        print(f"{args.directory}: not a reference set, missing config.json", file=sys.stderr)
        return 2
    stage_checks, _ = family_checks(ref)
    stages = tuple(stage_checks)
    if args.stages is not None:
        stages = tuple(s.strip() for s in args.stages.split(",") if s.strip())
    unknown = sorted(set(stages) - set(stage_checks))
    if unknown:
        print(
            f"--stages: unknown {', '.join(unknown)}; choose from {', '.join(stage_checks)}",
            file=sys.stderr,
        )
        return 2
    missing = missing_files(ref, stages)
    if missing:
        print(
            f"{args.directory}: not a reference set, missing {', '.join(missing)}", file=sys.stderr
        )
        return 2
    report = run_reference_checks(ref, torch.device(args.device), stages)
    for line in report.lines():
        print(line)
    failed = sum(not c.passed for c in report.checks) + sum(
        bool(p) for p in report.key_problems.values()
    )
    print(
        f"{len(report.checks)} arrays compared; "
        + ("all within tolerance" if report.passed else f"{failed} FAILED")
    )
    return 0 if report.passed else 1
