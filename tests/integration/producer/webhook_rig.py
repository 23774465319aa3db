"""What the webhook dispatcher's tests share: the signing secret, the dispatcher's settings
(short backoff, deadline and claim-idle), a Redis client, the real receiver, a dispatcher on a
thread with the job bodies given, and an outbox event. Test modules import the fixtures by
name (tests/integration/producer/test_webhook_dispatcher.py, test_webhook_errors.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from producer.webhooks.dispatcher import WebhookDispatcher
from shared.settings import Settings, load_settings
from shared.webhooks import WebhookEvent, append_event
from tests.doubles.webhook_receiver import Receiver, webhook_receiver

SECRET = "whsec_" + "c2VjcmV0LWZvci10ZXN0cy1vbmx5LTMyLWJ5dGVzISE="


@pytest.fixture(name="settings")
def settings_fixture(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name, value in {
        "COSYQ_REDIS_URL": redis_url,
        "COSYQ_WEBHOOK_SECRET": SECRET,
        "COSYQ_WEBHOOK_ALLOW_PRIVATE": "1",
        "COSYQ_WEBHOOK_BACKOFF_S": "0.2",
        "COSYQ_WEBHOOK_TIMEOUT_S": "2",
        "COSYQ_WEBHOOK_CLAIM_IDLE_S": "3",
        # a retry due after the 0.2 s backoff, and a stop, seen within 0.1 s, not 0.5 s
        "COSYQ_WEBHOOK_POLL_S": "0.1",
    }.items():
        monkeypatch.setenv(name, value)
    return load_settings(env_file=None)


@pytest.fixture(name="connection")
def connection_fixture(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture(name="receiver")
def receiver_fixture() -> Iterator[Receiver]:
    with webhook_receiver() as made:
        yield made


@contextmanager
def dispatching(
    connection: redis.Redis,
    settings: Settings,
    bodies: dict[str, Any] | None,
    body_of: Callable[[WebhookEvent], str | None] | None = None,
):
    """A dispatcher on a thread, the job bodies given (no jobs needed; None: its own, the
    bodies kept and the jobs in Redis), stopped on the way out."""
    if body_of is None and bodies is not None:
        body_of = lambda made: json.dumps(bodies[made.job_id])  # noqa: E731
    dispatcher = WebhookDispatcher(connection, settings, body_of=body_of)
    stop = threading.Event()
    thread = threading.Thread(target=dispatcher.run, args=(stop,))
    thread.start()
    try:
        yield dispatcher
    finally:
        stop.set()
        thread.join(timeout=30)
        assert not thread.is_alive()


def event(receiver: Receiver, job_id: str = "job-1") -> WebhookEvent:
    return WebhookEvent.for_job(
        "job.finished", job_id, receiver.url, "2026-12-01T00:00Z", "default"
    )


def append(connection: redis.Redis, made: WebhookEvent) -> None:
    append_event(connection, made, memory_s=3600)
