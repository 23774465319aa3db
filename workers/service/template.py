"""Workers forked from a pre-imported template process (COSYQ_POOL_START=template, Linux only).

Most of a worker's start is imports (torch, the model code, the quality measures' scipy), paid
again by every restart. In this mode the pool keeps one template: the stdlib's `multiprocessing`
forkserver, itself a fresh interpreter started with exec, which imports the worker's modules once
(`set_forkserver_preload`) and then only forks. Importing runs no tensor op, starts no OpenMP,
Core ML or CUDA state and opens no Redis connection, so each fork starts from a clean,
single-threaded process; the forked worker then loads the model, warms up and says ready exactly
as an exec-started one does (`workers.cli run`, the same arguments, the same control channel).

macOS keeps exec: fork without exec is unsafe once Objective-C, Core ML or Metal are loaded
(the system aborts such children), and the Core ML backend is the reason a Mac runs cosyq.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from shared.settings import Settings

EXEC, TEMPLATE = "exec", "template"
WORKER_MODULES = ("workers.service.commands", "workers.worker", "workers.service.lifecycle")
QUALITY_MODULES = ("pyloudnorm", "scipy.signal", "scipy.ndimage")  # import_measures()'s
# What an engine imports on first use, in its warm-up: the default engine's text normaliser
# (wetext: 0.3 s of tables built in Python, no threads, no files kept open).
ENGINE_FIRST_USE = {"workers.service.default_engine": ("wetext",)}


def start_mode(settings: Settings, platform: str = sys.platform) -> str:
    """The pool's way of starting a worker: the setting, except that only Linux forks."""
    return TEMPLATE if settings.pool_start == TEMPLATE and platform == "linux" else EXEC


def preload_modules(engine: str, *, quality_imports: bool) -> list[str]:
    """What the template imports: the worker, its engine's module (COSYQ_ENGINE) and, with
    COSYQ_QUALITY_IMPORT_AT_START, the quality measures; nothing of them runs a tensor op."""
    engine_module = engine.partition(":")[0]
    modules = [*WORKER_MODULES, engine_module, *ENGINE_FIRST_USE.get(engine_module, ())]
    if quality_imports:
        modules += QUALITY_MODULES
    return modules


class ForkedWorker:
    """A worker forked by the template, with `subprocess.Popen`'s process surface (pid, poll,
    wait, signals): the pool and the tests hold either kind the same way."""

    def __init__(self, process: Any, args: Sequence[str]) -> None:
        self._process = process
        self.args = list(args)  # `workers.cli`'s arguments, as Popen keeps its command

    @property
    def pid(self) -> int:
        return int(self._process.pid)

    @property
    def sentinel(self) -> int:
        """Readable once the worker has ended: the pool's select wakes on it (no SIGCHLD here,
        the worker is the template's child)."""
        return int(self._process.sentinel)

    @property
    def returncode(self) -> int | None:
        code = self._process.exitcode
        return None if code is None else int(code)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code; still running after `timeout` raises, as Popen's wait does."""
        self._process.join(timeout)
        code = self.returncode
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class WorkerTemplate:
    """The template process: `start()` once (its one-off cost), then `fork()` per worker.

    The stdlib keeps one forkserver per process: a second template in the same process (a test
    running the benchmark twice) reuses the first one's, imports and environment included.
    """

    def __init__(self, modules: Sequence[str], env: Mapping[str, str]) -> None:
        import multiprocessing  # noqa: PLC0415 (only in this mode: not at each exec start)

        self._context = multiprocessing.get_context("forkserver")
        self._modules = list(modules)
        self._env = dict(env)

    def start(self) -> float:
        """Start the template and let it import; returns the seconds it took."""
        started = time.perf_counter()
        self._context.set_forkserver_preload(self._modules)
        with _environment(self._env):  # what the worker modules read at import (metrics dir)
            # The first fork starts the template and waits for its imports (the pid it sends
            # back comes after them): an empty one times the whole one-off cost.
            process = self._context.Process(target=_nothing)
            process.start()
        process.join()
        return time.perf_counter() - started

    def fork(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        *,
        control: socket.socket | None = None,
        log_path: Path | None = None,
        cwd: Path | None = None,
    ) -> ForkedWorker:
        """`workers.cli ARGV` in a fork of the template, in a new session (like the exec
        mode's `start_new_session`), with `--control-fd` the child's copy of `control`, in
        `cwd` (by default the template's, the folder its starter was in)."""
        log = None if log_path is None else str(log_path)
        process = self._context.Process(
            target=run_forked_worker,
            args=(list(argv), dict(env), control, log, None if cwd is None else str(cwd)),
            name="cosyq-worker",
            daemon=False,
        )
        with _environment(self._env):  # should the template have died, it restarts alike
            process.start()
        return ForkedWorker(process, argv)


def run_forked_worker(
    argv: list[str],
    env: dict[str, str],
    control: socket.socket | None,
    log_path: str | None,
    cwd: str | None = None,
) -> None:
    """The forked child: the worker's own environment, session, folder and output, then the
    CLI."""
    os.setsid()  # a terminal's Ctrl+C reaches the pool only, which forwards it once
    if cwd is not None:
        os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    if log_path is not None:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    if control is not None:
        argv = [*argv, "--control-fd", str(control.detach())]
    from workers.cli import main  # noqa: PLC0415 (imported by the template already)

    sys.exit(main(argv))


@contextlib.contextmanager
def _environment(env: Mapping[str, str]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _nothing() -> None:
    """The empty fork's target."""
