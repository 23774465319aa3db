"""The webhook dispatcher against a real Redis and a real HTTP receiver: signed per Standard
Webhooks, delivered at least once under one webhook-id, retried with backoff, dead-lettered and
redelivered, never sent to a private address unless allowed, and taken over from a dead
dispatcher."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from standardwebhooks.webhooks import Webhook

from producer.cli import main as cosyq
from producer.webhooks.dispatcher import WebhookDispatcher
from producer.webhooks.store import WebhookStore
from shared import keys
from shared.settings import Settings, load_settings
from shared.webhooks import WebhookEvent, append_event
from tests.doubles.harness import wait_for
from tests.doubles.webhook_receiver import Receiver, webhook_receiver

SECRET = "whsec_" + "c2VjcmV0LWZvci10ZXN0cy1vbmx5LTMyLWJ5dGVzISE="


@pytest.fixture
def settings(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name, value in {
        "COSYQ_REDIS_URL": redis_url,
        "COSYQ_WEBHOOK_SECRET": SECRET,
        "COSYQ_WEBHOOK_ALLOW_PRIVATE": "1",
        "COSYQ_WEBHOOK_BACKOFF_S": "0.2",
        "COSYQ_WEBHOOK_TIMEOUT_S": "2",
        "COSYQ_WEBHOOK_CLAIM_IDLE_S": "3",
    }.items():
        monkeypatch.setenv(name, value)
    return load_settings(env_file=None)


@pytest.fixture
def connection(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with webhook_receiver() as made:
        yield made


@contextmanager
def dispatching(connection: redis.Redis, settings: Settings, bodies: dict[str, Any]):
    """A dispatcher on a thread, the job bodies given (no jobs needed), stopped on the way out."""
    dispatcher = WebhookDispatcher(
        connection, settings, body_of=lambda job_id: json.dumps(bodies[job_id])
    )
    stop = threading.Event()
    thread = threading.Thread(target=dispatcher.run, args=(stop,))
    thread.start()
    try:
        yield dispatcher
    finally:
        stop.set()
        thread.join(timeout=30)
        assert not thread.is_alive()


def event(receiver: Receiver, job_id: str = "job-1", attempt: int = 1) -> WebhookEvent:
    return WebhookEvent.for_job("job.finished", job_id, attempt, receiver.url, "2026-12-01T00:00Z")


def test_each_event_is_signed_and_redelivered_under_the_same_id(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    receiver.answers = [500, 503]  # two failed tries, then 200
    body = {"job_id": "job-1", "state": "finished"}
    append_event(connection, event(receiver))
    with dispatching(connection, settings, {"job-1": body}):
        wait_for(lambda: len(receiver.calls) == 3, 30, "three tries of one event")
        wait_for(lambda: WebhookStore(connection).counts() == (0, 0), 10, "the outbox empty")
    ids = {call.headers["webhook-id"] for call in receiver.calls}
    assert ids == {"msg_job-1_finished_1"}
    assert len({call.body for call in receiver.calls}) == 1  # the same bytes each time
    for call in receiver.calls:
        assert Webhook(SECRET).verify(call.body, call.headers) == body
    tampered = dict(receiver.calls[0].headers, **{"webhook-id": "msg_other"})
    with pytest.raises(Exception, match="signature"):
        Webhook(SECRET).verify(receiver.calls[0].body, tampered)


def test_a_receiver_that_keeps_failing_is_dead_lettered_then_redelivered(
    connection: redis.Redis, settings: Settings, receiver: Receiver, capsys: Any
) -> None:
    settings = settings.model_copy(update={"webhook_retry_hours": 2 / 3600})  # 2 s
    receiver.answers = [500] * 1000
    append_event(connection, event(receiver))
    store = WebhookStore(connection)
    with dispatching(connection, settings, {"job-1": {"job_id": "job-1"}}):
        wait_for(lambda: store.counts() == (0, 1), 30, "the event dead")
    tries = len(receiver.calls)
    assert tries >= 2
    assert cosyq(["--env-file", "/nonexistent", "webhooks", "failed"]) == 0
    listed = capsys.readouterr().out
    assert "msg_job-1_finished_1" in listed and "gave up after" in listed
    assert cosyq(["--env-file", "/nonexistent", "webhooks", "failed", "msg_nope"]) == 1
    assert cosyq(["--env-file", "/nonexistent", "webhooks", "failed", "--redeliver"]) == 0
    assert store.counts() == (1, 0)
    receiver.answers = []
    with dispatching(connection, settings, {"job-1": {"job_id": "job-1"}}):
        wait_for(lambda: store.counts() == (0, 0), 30, "the redelivered event delivered")
    assert len(receiver.calls) == tries + 1
    assert {c.headers["webhook-id"] for c in receiver.calls} == {"msg_job-1_finished_1"}


def test_a_private_address_is_never_called_unless_allowed(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    settings = settings.model_copy(update={"webhook_allow_private": False})
    append_event(connection, event(receiver))
    store = WebhookStore(connection)
    with dispatching(connection, settings, {"job-1": {}}):
        wait_for(lambda: store.counts() == (0, 1), 30, "the event refused")
    assert receiver.calls == []
    (record,) = store.dead_letters().values()
    assert "127.0.0.1, not a public address" in json.loads(record)["dead_reason"]


def test_redirects_are_not_followed(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    receiver.answers = [302]
    append_event(connection, event(receiver))
    with dispatching(connection, settings, {"job-1": {}}):
        wait_for(lambda: WebhookStore(connection).counts() == (0, 0), 30, "delivery on retry")
    assert [c.path for c in receiver.calls] == ["/hooks/", "/hooks/"]  # never /hooks/redirected


def test_a_slow_receiver_does_not_hold_up_another(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    with webhook_receiver() as slow:
        slow.delay_s = 1.5  # under the 2 s timeout: delivered, slowly
        for n in range(3):
            append_event(connection, event(slow, f"slow-{n}"))
        append_event(connection, event(receiver, "quick"))
        bodies = {f"slow-{n}": {} for n in range(3)} | {"quick": {}}
        started = time.monotonic()
        with dispatching(connection, settings, bodies):
            wait_for(lambda: receiver.calls, 10, "the quick receiver called")
            quick_after = time.monotonic() - started
            wait_for(lambda: len(slow.calls) == 3, 30, "the slow receiver's three")
    assert quick_after < 1.5 * 3  # not after the slow receiver's three, one by one


def test_an_event_a_dead_dispatcher_read_is_taken_over(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    store = WebhookStore(connection)
    store.ensure_group()
    append_event(connection, event(receiver))
    assert len(store.read_new("died-mid-delivery", 10, 100)) == 1  # read, never acknowledged
    pending = connection.xpending(keys.WEBHOOK_OUTBOX, keys.WEBHOOK_GROUP)
    assert pending["pending"] == 1
    with dispatching(connection, settings, {"job-1": {}}):
        wait_for(lambda: receiver.calls, 30, "the event delivered by the second dispatcher")
        wait_for(lambda: store.counts() == (0, 0), 10, "the outbox empty")
    assert connection.xpending(keys.WEBHOOK_OUTBOX, keys.WEBHOOK_GROUP)["pending"] == 0


def test_status_counts_waiting_and_dead_webhooks(
    connection: redis.Redis, settings: Settings, receiver: Receiver, capsys: Any, tmp_path: Path
) -> None:
    append_event(connection, event(receiver))
    assert cosyq(["--env-file", "/nonexistent", "status"]) == 0
    assert "webhooks: 1 waiting to be delivered, 0 dead" in capsys.readouterr().out
