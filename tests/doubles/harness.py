"""Real worker processes for the integration tests: environment, start, logs, waiting.

Workers run `workers.cli ...` from the repository root with a test engine from
tests/doubles/engines.py and JSON logs written to a file the test reads back as events.

How a `run` worker starts: forked from a template, the product's own pool template
(workers/service/template.py, COSYQ_POOL_START=template), one per test process, that has
imported the worker's modules and the test engines once. Most of an exec-started worker's CPU
is its imports (0.55 of 0.8 s for a light engine), paid by each of the suite's hundreds of
workers on two cores. The fork runs the same `workers.cli` main with the same arguments, its own
environment, folder, session and log; only the imports are shared. A test whose subject is the
start itself (start-up failures, exit codes, signals to a fresh process) starts with exec, as a
supervisor does: `Cluster(start_mode=EXEC)`, or the `worker_exec` marker for the service
tests' `cluster` fixture. Every other command (pool, bench, ...) starts with exec; a pool then
forks its own workers from its own template (COSYQ_POOL_START=template), or execs them in an
exec Cluster.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis
import soundfile as sf
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from shared.submitted import record_submitted
from shared.tenants import TENANT_META_KEY, tenant_of_queue
from workers.service.metrics import MULTIPROC_ENV
from workers.service.template import (
    ENGINE_FIRST_USE,
    QUALITY_MODULES,
    TEMPLATE,
    WORKER_MODULES,
    ForkedWorker,
    WorkerTemplate,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
ALLOWED_PARENT_COSYQ = {
    "COSYQ_REFERENCE_DIR",
    "COSYQ_REFERENCE3_DIR",
    "COSYQ_REQUIRE_REFERENCE",
    "COSYQ_PYTHON",
}


def write_model_dir(folder: Path) -> Path:
    """The two files the default voice needs: prompt.wav (1 s, 24 kHz) and prompt.txt."""
    folder.mkdir(parents=True, exist_ok=True)
    t = np.arange(24000, dtype=np.float32) / 24000
    sf.write(folder / "prompt.wav", 0.3 * np.sin(2 * np.pi * 200 * t), 24000)
    (folder / "prompt.txt").write_text("a test prompt", encoding="utf-8")
    return folder


# For a worker test whose worker exits in its start-up (storage probe, Redis login, model
# load), before a batch runner opens its session: COSYQ_BATCH_SIZE is read by nothing it runs,
# so it runs at one batch size, not at both (tests/integration/service/conftest.py).
BEFORE_ANY_BATCH = pytest.mark.parametrize("worker_batch_size", [1], ids=["batch1"])


WorkerProcess = subprocess.Popen[bytes] | ForkedWorker
# The worker's modules, the test engines and what the torch ones load (the real pipeline, the
# scripted batching model, the text normaliser), and the quality measures' imports: a
# tiny-model or batching worker spent 1.2 of its CPU seconds importing torch, and a worker's
# first measured job 0.5-2.5 s importing the measures, inside that job's timeout. Importing
# runs no tensor op and starts no OpenMP thread, as in the product's own template
# (workers/service/template.py).
TEMPLATE_MODULES = (
    *WORKER_MODULES,
    "tests.doubles.engines",
    "tests.doubles.stepped",
    "workers.engine.pipeline",
    "workers.service.default_engine",
    *ENGINE_FIRST_USE["workers.service.default_engine"],
    *QUALITY_MODULES,
)
_forked: list[ForkedWorker] = []  # every worker this test process's template forked


@functools.cache
def worker_template() -> WorkerTemplate:
    """The test process's template: started once, with the environment every worker's is
    built on (no COSYQ_ setting: each fork gets its own), imports done before the first fork."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("COSYQ_")}
    template = WorkerTemplate(TEMPLATE_MODULES, {**base, "PYTHONUNBUFFERED": "1"})
    template.start()
    # After multiprocessing's own exit hook, so run before it: that one waits for every child
    # still running, and a worker a test left running would hang the test process.
    atexit.register(_kill_forked)
    return template


def _kill_forked() -> None:
    for process in _forked:
        if process.poll() is None:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)


@dataclass
class Cluster:
    """Settings shared by every worker process of one test, and the processes it started."""

    redis_url: str
    root: Path
    overrides: dict[str, str] = field(default_factory=dict)
    processes: list[WorkerProcess] = field(default_factory=list)
    start_mode: str = TEMPLATE  # how `run` workers start (the module's docstring)

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("COSYQ_") or k in ALLOWED_PARENT_COSYQ
        }
        env.update(
            COSYQ_REDIS_URL=self.redis_url,
            COSYQ_ENGINE="tests.doubles.engines:fast",
            COSYQ_MODEL_DIR=str(write_model_dir(self.root / "model")),
            COSYQ_STORAGE_URL=(self.root / "out").as_uri(),
            COSYQ_LOG_FORMAT="json",
            COSYQ_HEARTBEAT_INTERVAL_S="0.5",
            COSYQ_HEARTBEAT_TTL_S="2",
            COSYQ_RETRY_BACKOFF_S="0",
            COSYQ_MAX_JOBS_JITTER="0",
            COSYQ_ORPHAN_AFTER_S="5",
            # an idle worker sees a stop or a retirement grant within one blocking pop: 0.2 s
            # here, not the default 1 s, so that each warm stop does not cost half a second
            COSYQ_DEQUEUE_POLL_S="0.2",
            # the loudness measure's imports (0.5-1 s) on first use, not at each of the
            # suite's hundreds of starts: most test jobs are shorter than one gating block
            COSYQ_QUALITY_IMPORT_AT_START="false",
            # a pool forks its workers from its own template, as `run` workers fork from the
            # test's (the module's docstring); the pools' own tests (test_pool,
            # test_stop_stress) check both ways of starting, and an exec Cluster execs
            COSYQ_POOL_START=self.start_mode,
            PYTHONUNBUFFERED="1",
        )
        env.update(self.overrides)
        env.update(extra)
        return env

    def start(self, *args: str, log_name: str, **extra: str) -> WorkerProcess:
        """`workers.cli ARGS` with stdout (JSON logs) to root/<log_name>: a `run` forked from
        the template (a worker with a metrics folder execs: prometheus reads it at import),
        anything else `python -m workers.cli ARGS`."""
        env = self.env(**extra)
        if self.start_mode == TEMPLATE and args[:1] == ("run",) and MULTIPROC_ENV not in env:
            log_path = self.root / log_name
            worker = worker_template().fork(args, env, log_path=log_path, cwd=REPO_ROOT)
            _forked[:] = [*(p for p in _forked if p.poll() is None), worker]
            self.processes.append(worker)
            return worker
        return self.spawn([sys.executable, "-m", "workers.cli", *args], log_name, **extra)

    def spawn(self, command: list[str], log_name: str, **extra: str) -> subprocess.Popen[bytes]:
        log_file = (self.root / log_name).open("ab")
        process = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=self.env(**extra),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        log_file.close()
        self.processes.append(process)
        return process

    def events(self, log_name: str) -> list[dict[str, Any]]:
        return read_events(self.root / log_name)

    def stop_all(self) -> None:
        """Kill whatever a test left running (each process we started, by its own pid)."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=10)


@contextlib.contextmanager
def pool_of_two(redis_url: str, root: Path, overrides: dict[str, str]) -> Iterator[Cluster]:
    """A `cosyq-worker pool -n 2` on these settings for a test's length, stopped warmly (a
    SIGTERM: the pool stops its workers; a SIGKILL would orphan them). Its workers fork from the
    pool's template, as every Cluster's pool does unless told otherwise."""
    cluster = Cluster(redis_url=redis_url, root=root, overrides=overrides)
    pool = cluster.start("pool", "-n", "2", log_name="pool.log")
    try:
        yield cluster
    finally:
        pool.send_signal(signal.SIGTERM)
        try:
            pool.wait(timeout=60)
        finally:
            cluster.stop_all()


@contextlib.contextmanager
def clean_database(url: str) -> Iterator[str]:
    """`url`'s database flushed before and after (a server we started), as the `redis_url`
    fixture gives one test: for a module-scoped pool whose tests share its database."""
    connection = redis.Redis.from_url(url)
    connection.flushdb()
    try:
        yield url
    finally:
        connection.flushdb()
        connection.close()


def client_settings(cluster: Cluster, monkeypatch: Any) -> Any:
    """The cluster's COSYQ_ settings, set for this test's process too (producer side)."""
    from shared.settings import load_settings  # noqa: PLC0415

    for name, value in cluster.env().items():
        if name.startswith("COSYQ_"):
            monkeypatch.setenv(name, value)
    return load_settings(env_file=None)


def read_events(path: Path) -> list[dict[str, Any]]:
    """JSON log lines as dicts (other lines, e.g. a traceback on stderr, skipped)."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return events


def named(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [event for event in events if event.get("event") == name]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll until predicate() is truthy; fail the test with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def json_queue(connection: redis.Redis, name: str = "cosyq-default") -> Queue:
    return Queue(name, connection=connection, serializer=JSONSerializer)


def enqueue(
    connection: redis.Redis, text: str, *, queue: str = "cosyq-default", **options: Any
) -> Job:
    """Enqueue one synthesize job the way the producer does (dotted path, JSON, tagged with
    the tenant whose queue it is: a job without its tenant tag is nobody's)."""
    retry = options.pop("retry", None)
    request = {"text": text, **options}
    meta = {TENANT_META_KEY: tenant_of_queue(queue)}
    job = json_queue(connection, queue).enqueue(
        "workers.tasks.synthesize", request=request, retry=retry, meta=meta
    )
    record_submitted(connection, [job.id])  # as the producer does, for the orphan sweep
    return job


def statuses(connection: redis.Redis, jobs: list[Job]) -> list[str]:
    out = []
    for job in jobs:
        job.refresh()
        out.append(str(job.get_status(refresh=False).value))
    return out


def all_done(connection: redis.Redis, jobs: list[Job], final: tuple[str, ...] = ("finished",)):
    def check() -> bool:
        return all(status in final for status in statuses(connection, jobs))

    return check


def lines(path: Path) -> Iterator[str]:
    yield from path.read_text(encoding="utf-8", errors="replace").splitlines()
