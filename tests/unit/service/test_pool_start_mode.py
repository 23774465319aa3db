"""COSYQ_POOL_START: which way the pool starts a worker, and what its template imports."""

from __future__ import annotations

import ast
import json
import multiprocessing
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shared.errors import SettingsError
from shared.settings import Settings, load_settings
from workers.cli import build_parser
from workers.service.template import (
    EXEC,
    QUALITY_MODULES,
    TEMPLATE,
    WORKER_MODULES,
    ForkedWorker,
    preload_modules,
    start_mode,
)

ROOT = Path(__file__).resolve().parents[3]


def test_exec_is_the_default_everywhere() -> None:
    assert Settings().pool_start == EXEC
    assert start_mode(Settings(), platform="linux") == EXEC
    assert start_mode(Settings(), platform="darwin") == EXEC


def test_the_pools_help_names_the_template_mode(capsys: pytest.CaptureFixture[str]) -> None:
    """`cosyq-worker pool --help` said every worker was a fresh interpreter, never a fork."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["pool", "--help"])
    described = " ".join(capsys.readouterr().out.split())
    assert "never a fork" not in described
    assert "COSYQ_POOL_START=template" in described


def test_the_template_is_linux_only_and_macos_keeps_exec() -> None:
    chosen = Settings(pool_start="template")
    assert start_mode(chosen, platform="linux") == TEMPLATE
    assert start_mode(chosen, platform="darwin") == EXEC  # fork is unsafe after Core ML/Metal


def test_an_unknown_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSYQ_POOL_START", "fork")
    with pytest.raises(SettingsError):
        load_settings()


def test_the_template_imports_the_worker_its_engine_and_the_measures_it_would_import() -> None:
    engine = "workers.service.default_engine:engine_from_settings"
    with_measures = preload_modules(engine, quality_imports=True)
    assert "workers.service.default_engine" in with_measures
    assert "wetext" in with_measures  # the default engine's normaliser, imported by its warm-up
    assert "workers.worker" in with_measures
    assert set(QUALITY_MODULES) <= set(with_measures)
    light = preload_modules("tests.doubles.engines:fast", quality_imports=False)
    assert "tests.doubles.engines" in light
    assert not set(QUALITY_MODULES) & set(light)  # as an exec start would: on first use


def test_the_templates_imports_start_nothing_a_fork_would_inherit() -> None:
    """No CUDA state, no Python thread, no socket (Redis) in the template after importing our
    modules (the third-party ones it adds, wetext and scipy, are left out: 1-2 s of the suite)."""
    modules = [*WORKER_MODULES, "workers.service.default_engine"]
    code = (
        "import importlib, json, os, threading, torch\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "links = [f'/proc/self/fd/{fd}' for fd in os.listdir('/proc/self/fd')]\n"
        "fds = [os.readlink(link) for link in links if os.path.lexists(link)]\n"
        "print(json.dumps([torch.cuda.is_initialized(), threading.active_count(),\n"
        "                  [fd for fd in fds if fd.startswith('socket:')]]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == [False, 1, []]


def _environment_reads_at_import(source: str) -> list[int]:
    """Lines that read os.environ or os.getenv outside any function (at import)."""
    found: list[int] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue  # runs when called, with the caller's environment
            if isinstance(child, ast.Attribute) and child.attr in ("environ", "getenv"):
                found.append(child.lineno)
            visit(child)

    visit(ast.parse(source))
    return found


def test_no_module_a_template_imports_reads_the_environment_at_import() -> None:
    """A template imports once, under one environment; each fork then runs under its own (the
    pool's worker env, or a test's own settings: tests/doubles/harness.py). A value read at
    import would be the template's in every fork: the test batching engine's step time was."""
    files = [
        *(ROOT / "workers").rglob("*.py"),
        *(ROOT / "shared").rglob("*.py"),
        *(ROOT / "tests" / "doubles").rglob("*.py"),
    ]
    reads = {
        str(path.relative_to(ROOT)): lines
        for path in files
        if (lines := _environment_reads_at_import(path.read_text(encoding="utf-8")))
    }
    assert len(files) > 100 and reads == {}


def test_an_environment_read_at_import_is_found() -> None:
    source = "import os\nA = os.environ.get('X')\n\nclass C:\n    b = os.getenv('Y')\n"
    inside = "import os\n\ndef f():\n    return os.environ['X']\n"
    assert _environment_reads_at_import(source) == [2, 5]
    assert _environment_reads_at_import(inside) == []


def test_a_forked_worker_waits_and_stops_as_a_popen_does() -> None:
    """ForkedWorker is held where a Popen is (the pool's slots, the tests' clusters): a wait
    that times out raises, kill and terminate signal it, the code of a killed one is -signal."""
    process = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
    process.start()
    worker = ForkedWorker(process, ["run", "--burst"])
    with pytest.raises(subprocess.TimeoutExpired) as waited:
        worker.wait(timeout=0.1)
    assert waited.value.cmd == ["run", "--burst"] and worker.poll() is None
    worker.kill()
    assert worker.wait(timeout=30) == -signal.SIGKILL == worker.returncode
    worker.terminate()  # an ended worker: nothing to signal, no error
