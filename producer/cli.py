"""`cosyq`: the producer-side command line (submit, say, status, failed, result, ...).

Each command group lives in its own module under `producer/commands/` exposing
`register(subparsers)`; its handlers take `(args, context)` and return the exit status. Add a
group by naming its commands' module in `COMMANDS`: a command line registers only the module
of the command it names (shared/cli_commands.py). Settings come from COSYQ_* variables and
`.env`; logs go to stderr, command output to stdout.

Exit status: one table for every command, in `producer/commands/exits.py` (0 done, 1 failed,
2 usage or settings, 3 not done yet, 4 no such job, 5 Redis unreachable, 6 canceled, 141 stdout
closed).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis
from rich.console import Console

from producer.commands.exits import exit_status, quiet_broken_pipe
from shared.cli_commands import chosen_modules
from shared.connection import settings_error
from shared.console import CommandConsole, EscapingConsole
from shared.errors import CosyqError, SettingsError
from shared.logs import configure_logging
from shared.settings import Settings, load_settings

if TYPE_CHECKING:
    from producer.client import CosyqClient

# Each command → the module that registers it (in help's order).
COMMANDS: dict[str, str] = {
    "submit": "producer.commands.submit",  # submit FILE.jsonl
    "say": "producer.commands.submit",  # say "text"
    "status": "producer.commands.inspect",
    "failed": "producer.commands.inspect",
    "result": "producer.commands.inspect",
    "cancel": "producer.commands.cancel",  # cancel JOB_ID...
    "erase": "producer.commands.erase",  # erase ID... [--document] [--output-key]
    "stream": "producer.commands.stream",  # stream JOB_ID
    "document": "producer.commands.documents",  # document submit|status|retry|result
    "voices": "producer.commands.voices",  # voices list|add|rm
    "serve": "producer.commands.serve",  # serve (the HTTP front; needs cosyq[http])
    "webhooks": "producer.commands.webhooks",  # webhooks run|failed
    "bench": "producer.commands.bench_ui",  # bench ui (the /ui page with many jobs in Redis)
}
TOP_OPTIONS_WITH_VALUE = frozenset({"--env-file"})

PIPED_WIDTH = 160  # columns for tables when stdout is not a terminal
ClientFactory = Callable[[Settings], "CosyqClient"]


@dataclass
class CliContext:
    """What every command handler gets: settings, a way to make the client, two consoles."""

    settings: Settings
    make_client: ClientFactory
    out: CommandConsole  # command output (stdout)
    err: Console  # progress, warnings, problems (stderr)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The parser with every command, or with argv's command alone when it names one."""
    parser = argparse.ArgumentParser(
        prog="cosyq",
        description="cosyq producer: submit speech jobs to Redis and read their results",
    )
    parser.add_argument(
        "--env-file", default=".env", help="settings file read besides COSYQ_* (default .env)"
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = chosen_modules(argv, COMMANDS, options_with_value=TOP_OPTIONS_WITH_VALUE)
    for module_name in modules:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None, *, client_factory: ClientFactory | None = None) -> int:
    """Parse arguments and run the chosen command; returns the exit status.

    `client_factory` lets tests (and embedding code) choose how the client is built.
    """
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    err = EscapingConsole(stderr=True, highlight=False, soft_wrap=True)
    try:
        settings = load_settings(env_file=args.env_file)
    except SettingsError as e:
        err.print(f"cosyq: {e}", markup=False)
        return 2
    configure_logging(settings, stream=sys.stderr)
    context = CliContext(
        settings=settings, make_client=client_factory or _client, out=_stdout(), err=err
    )
    try:
        return context.out.exit_status(int(args.handler(args, context) or 0))
    except BrokenPipeError:
        return quiet_broken_pipe()
    except (CosyqError, redis.RedisError) as e:
        err.print(f"cosyq: {_one_line(e, settings)}", markup=False)
        return exit_status(e)


def _client(settings: Settings) -> CosyqClient:
    """The client, imported once a command needs one (redis's asyncio client, rq, numpy)."""
    from producer.client import CosyqClient  # noqa: PLC0415

    return CosyqClient(settings)


def _one_line(error: CosyqError | redis.RedisError, settings: Settings) -> str:
    """What the user reads: our messages as they are; Redis's with the URL (password masked)."""
    if isinstance(error, CosyqError):
        return str(error)
    refused = settings_error(error, settings)  # password, ACL or TLS: a setting to fix
    if refused is not None:
        return str(refused)
    return f"Redis at {settings.redacted_redis_url()}: {error}"


def _stdout() -> CommandConsole:
    """Command output; piped into a file it is not cut to 80 columns; a closed pipe is quiet
    and the command runs to its end (then exits 141: shared/console.py)."""
    console = CommandConsole(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        width = max(console.width, PIPED_WIDTH)
        console = CommandConsole(highlight=False, soft_wrap=True, width=width)
    return console


if __name__ == "__main__":
    sys.exit(main())
