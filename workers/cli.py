"""`cosyq-worker`: the worker-side command line.

Each command group lives in its own module exposing `register(subparsers)`; registering stays
cheap (no torch import) so `cosyq-worker --help` is instant, and each command imports what it
needs when it runs. Add a group by naming its commands' module in `COMMANDS`: a command line
registers only the module of the command it names (shared/cli_commands.py), so `bench` or
`doctor` starts without the service's modules (redis's asyncio client, rq, numpy).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys
from collections.abc import Sequence

from shared.cli_commands import chosen_modules
from shared.errors import SettingsError

EXIT_SETTINGS = 2  # as `run` and `pool` exit on a bad setting (workers/service/commands.py)

# Each command → the module that registers it (in help's order).
COMMANDS: dict[str, str] = {
    "run": "workers.service.commands",
    "pool": "workers.service.commands",
    "model": "workers.tools.model_cli",
    "deploy": "workers.tools.deploy_cli",
    "bench": "workers.tools.bench.cli",
    "doctor": "workers.tools.doctor.cli",
    "convert": "workers.coreml.convert.cli",
}


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser with every command, or with argv's command alone when it names one."""
    parser = argparse.ArgumentParser(
        prog="cosyq-worker", description="cosyq worker: run, pool, model tools, benchmarks"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in chosen_modules(argv, COMMANDS):
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse arguments and run the chosen command; its return value is the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except SettingsError as e:  # a tool's bad setting: one line, never a traceback
        print(f"cosyq-worker: {e}", file=sys.stderr)
        return EXIT_SETTINGS
    finally:
        # The interpreter's exit runs one last full collection over every object the process
        # made (pydantic's schemas, numpy, a model): 0.1-0.6 s of each worker's exit here. Frozen,
        # they are left to the exit's own teardown; the suite and a pool restart hundreds.
        gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
