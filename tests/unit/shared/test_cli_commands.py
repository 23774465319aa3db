"""A command line registers only the module of the command it names (shared/cli_commands.py):
each CLI's table names every command its modules register, and a start imports no other
command's modules."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import producer.cli
import workers.cli
from shared.cli_commands import chosen_modules

ROOT = Path(__file__).resolve().parents[3]
TABLE = {"status": "inspect", "failed": "inspect", "say": "submit", "serve": "serve"}
EVERY = ("inspect", "submit", "serve")


@pytest.mark.parametrize(
    ("argv", "modules"),
    [
        (None, EVERY),
        ([], EVERY),
        (["status"], ("inspect",)),
        (["say", "--voice", "x", "status"], ("submit",)),  # the first word names the command
        (["--env-file", "serve", "status"], ("inspect",)),  # an option's value is no command
        (["--env-file=x", "serve"], ("serve",)),
        (["-h", "status"], EVERY),  # help lists every command
        (["--help"], EVERY),
        (["--env", "x", "status"], EVERY),  # an abbreviated option: argparse decides
        (["--", "status"], EVERY),
        (["bogus"], EVERY),  # argparse's error lists every command
        (["--env-file"], EVERY),
    ],
)
def test_the_named_command_alone_else_every_module(
    argv: list[str] | None, modules: tuple[str, ...]
) -> None:
    assert chosen_modules(argv, TABLE, options_with_value=frozenset({"--env-file"})) == modules


@pytest.mark.parametrize("cli", [producer.cli, workers.cli], ids=["cosyq", "cosyq-worker"])
def test_each_module_registers_the_commands_the_table_gives_it(cli: object) -> None:
    commands: dict[str, str] = cli.COMMANDS  # type: ignore[attr-defined]
    for module in dict.fromkeys(commands.values()):
        subparsers = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(subparsers)
        assert set(subparsers.choices) == {c for c, m in commands.items() if m == module}, module


def _modules_after(cli: str, argv: list[str]) -> list[str]:
    """The modules of this project a CLI start imported, its settings refused (exit 2)."""
    code = (
        "import json, sys\n"
        f"from {cli} import main\n"
        f"status = main({argv!r})\n"
        "print(json.dumps([status, sorted(m for m in sys.modules"
        " if m.split('.')[0] in ('producer', 'workers'))]))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYQ_")}
    env["COSYQ_MAX_JOBS"] = "many"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    status, modules = json.loads(out.stdout)
    assert status == 2, out.stderr
    return list(modules)


def test_cosyq_status_imports_neither_the_client_nor_other_commands() -> None:
    modules = _modules_after("producer.cli", ["status"])
    assert "producer.commands.inspect" in modules
    others = {m for m in producer.cli.COMMANDS.values() if m != "producer.commands.inspect"}
    assert not others & set(modules), modules
    assert "producer.client" not in modules


def test_cosyq_worker_bench_leaves_the_service_out() -> None:
    modules = _modules_after("workers.cli", ["bench", "queue"])
    assert "workers.tools.bench.cli" in modules
    assert not {m for m in modules if m.startswith("workers.service")}, modules
