"""Run jobs the way RQ does, for the producer's tests: in-process burst or a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import redis
from rq import Queue, SimpleWorker
from rq.serializers import JSONSerializer

from shared.keys import QUEUES_IN_PRIORITY_ORDER
from shared.settings import Settings

REPO_ROOT = Path(__file__).resolve().parents[2]


def run_burst(connection: redis.Redis) -> None:
    """Run every queued job with a stock SimpleWorker (JSON serializer) until the queues are
    empty."""
    queues = [
        Queue(name, connection=connection, serializer=JSONSerializer)
        for name in QUEUES_IN_PRIORITY_ORDER
    ]
    worker = SimpleWorker(queues, connection=connection, serializer=JSONSerializer)
    worker.work(burst=True)


def start_worker_process(redis_url: str, *, burst: bool) -> subprocess.Popen[bytes]:
    """`rq worker` with SimpleWorker and the JSON serializer in a fresh interpreter."""
    args = [sys.executable, "-m", "rq.cli", "worker", "--url", redis_url]
    args += ["-w", "rq.worker.SimpleWorker", "-S", "rq.serializers.JSONSerializer", "-q"]
    if burst:
        args.append("--burst")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.Popen(
        [*args, *QUEUES_IN_PRIORITY_ORDER],
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


def run_cosyq_burst(settings: Settings) -> None:
    """Run every queued job with the real CosyqWorker (engine from settings) until empty."""
    from workers.worker import CosyqWorker  # noqa: PLC0415 (torch only for tests that need it)

    connection = redis.Redis.from_url(settings.redis_url)
    try:
        CosyqWorker(QUEUES_IN_PRIORITY_ORDER, connection=connection, settings=settings).work(
            burst=True
        )
    finally:
        connection.close()
