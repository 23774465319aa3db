"""Run the producer's jobs: the real CosyqWorker in this process (burst) or in a subprocess
(`cosyq-worker run`), with the engine the settings name; or a stock RQ worker, which is what
runs a cosyq job when someone starts plain `rq worker` on cosyq's queues."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import redis
from rq import Queue, SimpleWorker
from rq.serializers import JSONSerializer

from shared.keys import QUEUES_IN_PRIORITY_ORDER
from shared.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_burst(connection: redis.Redis) -> None:
    """Run every queued job with a stock SimpleWorker (JSON serializer, no CosyqWorker, so no
    engine) until the queues are empty."""
    queues = [
        Queue(name, connection=connection, serializer=JSONSerializer)
        for name in QUEUES_IN_PRIORITY_ORDER
    ]
    worker = SimpleWorker(queues, connection=connection, serializer=JSONSerializer)
    worker.work(burst=True)


def start_worker_process(redis_url: str, *, burst: bool) -> subprocess.Popen[bytes]:
    """`cosyq-worker run` in a fresh interpreter; its other settings come from the environment
    (COSYQ_ENGINE names a test engine)."""
    args = [sys.executable, "-m", "workers.cli", "run", *(["--burst"] if burst else [])]
    # a warm stop reaches an idle worker within one blocking pop: 0.2 s unless a test says
    # (and the loudness measure's imports on first use, not at start: harness.py says why)
    env = {"COSYQ_DEQUEUE_POLL_S": "0.2", "COSYQ_QUALITY_IMPORT_AT_START": "false", **os.environ}
    env.update(PYTHONPATH=str(REPO_ROOT), COSYQ_REDIS_URL=redis_url)
    return subprocess.Popen(
        args,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def stop_worker_process(process: subprocess.Popen[bytes]) -> None:
    """Warm shutdown (SIGTERM finishes the current job), then reap."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if process.stderr is not None:
        process.stderr.close()


def run_cosyq_burst(settings: Settings, queues: Sequence[str] = QUEUES_IN_PRIORITY_ORDER) -> None:
    """Run every job queued in `queues` with the real CosyqWorker (engine from settings) until
    they are empty."""
    from workers.worker import CosyqWorker  # noqa: PLC0415 (torch only for tests that need it)

    connection = redis.Redis.from_url(settings.redis_url)
    try:
        CosyqWorker(queues, connection=connection, settings=settings).work(burst=True)
    finally:
        connection.close()


@contextlib.contextmanager
def engines_reused() -> Iterator[None]:
    """Meanwhile, an in-process worker (`run_cosyq_burst`) whose engine settings equal an
    earlier one's in this block takes that worker's loaded, warmed engine instead of loading
    and warming its own (0.6 of each tiny-model burst's 0.7 CPU s). The first of each is loaded
    and warmed by the product's own `load_engine`; the engine keeps no request's state (a
    request's seed, voice and text come with it; its voice prefixes are keyed by the prompt's
    content), so reusing it leaves the tests independent."""
    from workers.service import lifecycle  # noqa: PLC0415 (torch only for tests that need it)
    from workers.service.default_engine import engine_options  # noqa: PLC0415

    loaded: dict[str, Any] = {}
    real = lifecycle.load_engine

    def load_once(settings: Settings) -> Any:
        s = settings
        where = (s.engine, s.model_dir, s.backend, s.coreml_dir, s.device, s.dtype)
        key = repr((*where, s.llm_precision, s.threads, engine_options(s)))
        if key not in loaded:
            loaded[key] = real(settings)
        return loaded[key]

    lifecycle.load_engine = load_once  # type: ignore[assignment]
    try:
        yield
    finally:
        lifecycle.load_engine = real
