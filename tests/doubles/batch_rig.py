"""A BatchRunner with the real books on a private redis-server, without a worker process.

RQ's own SimpleWorker does the registry steps, `AttemptBooks` keeps each attempt, and a small
gate stands in for the worker. The engine is the caller's: the real one on the tiny model, or
a test engine from tests/doubles/engines.py.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from rq.job import Job
from rq.queue import Queue
from rq.serializers import JSONSerializer
from rq.worker import SimpleWorker

from shared import keys
from shared.jobs import RequestLimits
from shared.settings import Settings
from shared.storage import open_storage
from shared.voices import VoiceRegistry
from tests.doubles.harness import write_model_dir
from workers.engine.api import SynthesisEngine
from workers.service.admission import CosyqJob
from workers.service.attempts import AttemptBooks
from workers.service.batch_runner import BatchRunner
from workers.service.job_runtime import WorkerRuntime, install_runtime, prompt_roots
from workers.service.lifecycle import WorkerIdentity, build_housekeeper
from workers.voices.book import VoiceBook

QUEUE = "cosyq-default"
NAME = "unit-runner"


class OpenGate:
    """The worker as a window sees it: admitting, a large budget, never suspended; `on_room`
    runs each time the window asks how many jobs are left (a test blocks the thread there)."""

    def __init__(self, on_room: Callable[[], None] | None = None) -> None:
        self.open = True
        self.on_room = on_room

    def admission_open(self) -> bool:
        return self.open

    def jobs_left(self) -> int:
        if self.on_room is not None:
            self.on_room()
        return 100

    def window_heartbeat(self) -> bool:
        return False


@dataclasses.dataclass
class Rig:
    runner: BatchRunner
    books: AttemptBooks
    queue: Queue
    connection: redis.Redis
    ends: list[bool]
    out: Path

    def enqueue(self, text: str, **options: Any) -> Job:
        timeout = options.pop("job_timeout", None)
        return self.queue.enqueue(
            keys.SYNTHESIZE_FUNCTION, request={"text": text, **options}, job_timeout=timeout
        )

    def first_job(self) -> Job:
        """Popped as RQ's loop pops the first job of a window."""
        job_id = self.connection.lpop(self.queue.key)
        assert job_id is not None
        return CosyqJob.fetch(
            job_id.decode(), connection=self.connection, serializer=JSONSerializer
        )


@contextmanager
def batch_rig(
    redis_url: str,
    engine: SynthesisEngine,
    root: Path,
    *,
    gate: OpenGate | None = None,
    worker_connection: redis.Redis | None = None,
    **settings_values: Any,
) -> Iterator[Rig]:
    """`worker_connection`: the client RQ's steps and the books use (a test may make it fail)."""
    settings = Settings(
        _env_file=None,
        redis_url=redis_url,
        storage_url=(root / "out").as_uri(),
        model_dir=write_model_dir(root / "voice"),
        **{"batch_size": 4, "retry_backoff_s": 0, **settings_values},
    )
    connection = redis.Redis.from_url(redis_url)
    steps = worker_connection if worker_connection is not None else connection
    storage = open_storage(settings)
    voices = VoiceBook(
        engine,
        storage,
        model_dir=settings.model_dir,
        registry=VoiceRegistry(connection),
        max_prompt_seconds=settings.max_prompt_seconds,
        cache_ttl_s=settings.default_voice_cache_ttl_s,
    )
    limits = RequestLimits.from_settings(settings)
    runtime = WorkerRuntime(
        settings, engine, storage, voices, limits, NAME, os.getpid(), prompt_roots(settings)
    )
    install_runtime(runtime)
    queue = Queue(QUEUE, connection=steps, job_class=CosyqJob, serializer=JSONSerializer)
    worker = SimpleWorker(
        [queue], connection=steps, serializer=JSONSerializer, job_class=CosyqJob, name=NAME
    )
    housekeeper = build_housekeeper(settings, WorkerIdentity(NAME, "host", (QUEUE,)))
    ends: list[bool] = []
    books = AttemptBooks(worker, housekeeper, settings, on_end=ends.append)
    window = BatchRunner(settings, steps, [queue], books=books, gate=gate or OpenGate())
    try:
        yield Rig(window, books, queue, connection, ends, root / "out")
    finally:
        window.close()
        install_runtime(None)
        housekeeper.connection.close()
        connection.close()
