"""A worker's exit does not wait on RQ's channel listener (`rq suspend`, kill-horse messages).

RQ 3.0 starts that listener polling every 60 s, and redis-py 8.2's `PubSubWorkerThread.stop()`
waits for the thread: every worker exit could take a minute (seen as 60 s timeouts across the
integration tests). Our worker polls every `PUBSUB_POLL_S`.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from shared.keys import QUEUES_IN_PRIORITY_ORDER
from shared.settings import load_settings

# Workers start with exec, as a supervisor starts them: the subject is the process's exit.
pytestmark = pytest.mark.worker_exec


def test_the_channel_listener_polls_often_and_unsubscribing_is_quick(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers.worker import PUBSUB_POLL_S, CosyqWorker  # noqa: PLC0415

    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_STORAGE_URL", (tmp_path / "storage").as_uri())
    monkeypatch.setenv("COSYQ_ENGINE", "tests.doubles.engines:fast")  # not loaded: no bootstrap
    connection = redis.Redis.from_url(redis_url)
    queues = [
        Queue(name, connection=connection, serializer=JSONSerializer)
        for name in QUEUES_IN_PRIORITY_ORDER
    ]
    worker = CosyqWorker(queues, connection=connection, settings=load_settings(env_file=None))
    worker.subscribe()
    try:
        assert worker.pubsub_thread is not None
        assert worker.pubsub_thread.sleep_time == PUBSUB_POLL_S <= 1.0
        worker.pubsub.unsubscribe()
        time.sleep(3 * PUBSUB_POLL_S)  # the listener now waits for a subscription again
    finally:
        started = time.monotonic()
        worker.unsubscribe()
        took = time.monotonic() - started
        connection.close()
    assert took < 5.0
    assert worker.pubsub_thread is not None and not worker.pubsub_thread.is_alive()
