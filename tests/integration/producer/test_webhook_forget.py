"""An erasure forgets its subject's webhook events (producer/webhooks/forget.py), on a real
Redis with a real dispatcher and receiver: every copy of an erased job's or document's event
body (the kept body, a delivery waiting for its retry, a dead letter, a document's outbox entry)
is gone, another subject's untouched, and an erased job's event a dispatcher meets after all
(promoted from the retries at that moment) is dropped, never sent, never dead-lettered."""

from __future__ import annotations

import json
import time
from typing import Any, cast

import redis

from producer.webhooks.bodies import settle
from producer.webhooks.forget import forget_document_events, forget_job_events
from producer.webhooks.records import Delivery
from producer.webhooks.store import WebhookStore
from shared import keys
from shared.settings import Settings
from shared.webhooks import WebhookEvent
from tests.doubles.harness import wait_for
from tests.doubles.webhook_receiver import Receiver
from tests.integration.producer.webhook_rig import (  # noqa: F401 (fixtures used by name)
    append,
    connection_fixture,
    dispatching,
    receiver_fixture,
    settings_fixture,
)


def _job_event(receiver: Receiver, job_id: str) -> WebhookEvent:
    return WebhookEvent.for_job("job.finished", job_id, receiver.url, "2026-12-01T00:00Z", "alpha")


def _held(connection: redis.Redis) -> str:
    """Every key's name and value, as one text."""
    parts = []
    for raw in connection.scan_iter(count=1000):
        kind = cast(bytes, connection.type(raw)).decode()
        held: Any = None
        if kind == "hash":
            held = connection.hgetall(raw)
        elif kind == "zset":
            held = connection.zrange(raw, 0, -1)
        elif kind == "stream":
            held = connection.xrange(raw)
        elif kind == "string":
            held = connection.get(raw)
        parts.append(f"{raw!r} {held}")
    return "\n".join(parts)


def _document_entry(connection: redis.Redis, receiver: Receiver, document_id: str) -> None:
    body = json.dumps({"document_id": document_id, "metadata": {"who": f"meta-{document_id}"}})
    fields: dict[Any, Any] = {"webhook_id": f"msg_{document_id}_finished_1"}
    fields["event"] = "document.finished"
    fields |= {"job_id": document_id, "url": receiver.url, "at": "2026-12-01T00:00Z"}
    fields |= {"tenant": "alpha", "body": body}
    connection.xadd(keys.WEBHOOK_OUTBOX, dict(fields))


def test_every_copy_of_an_erased_subjects_events_is_forgotten(
    connection: redis.Redis, receiver: Receiver
) -> None:
    store = WebhookStore(connection)
    store.ensure_group()
    for job_id in ("job-a", "job-b"):
        made = _job_event(receiver, job_id)
        append(connection, made)
        body = json.dumps({"job_id": job_id, "result": {"metadata": {"who": f"meta-{job_id}"}}})
        settle(connection, made, body, 3600)
        retry = Delivery(made, body, tries=1, first_try_at=time.time())
        connection.zadd(keys.WEBHOOK_RETRY, {retry.to_json(): time.time() + 600})
        dead = json.loads(retry.to_json()) | {"dead_reason": "503", "dead_at": time.time()}
        store.dead("0-1", made.webhook_id, json.dumps(dead))
        connection.xadd(keys.WEBHOOK_OUTBOX, {"delivery": retry.to_json()})  # one come due
    for document_id in ("doc-d", "doc-e"):
        _document_entry(connection, receiver, document_id)
    assert all(f"meta-{s}" in _held(connection) for s in ("job-a", "job-b", "doc-d", "doc-e"))

    forget_job_events(connection, "job-a", "alpha", runs=1, memory_s=3600)
    forget_document_events(connection, "doc-d")

    held = _held(connection)
    assert "meta-job-a" not in held and "meta-doc-d" not in held
    assert held.count("meta-job-b") == 4  # kept body, retry, dead letter, retry come due
    assert held.count("meta-doc-e") == 1  # its outbox entry
    assert connection.zcard(keys.WEBHOOK_DEAD_AT) == 1
    assert connection.xlen(keys.WEBHOOK_OUTBOX) == 3  # job-b's event and retry, doc-e's


def test_an_erased_jobs_event_met_after_all_is_dropped_not_sent(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    erased, kept = _job_event(receiver, "job-a"), _job_event(receiver, "job-b")
    for made in (erased, kept):
        append(connection, made)
        settle(connection, made, json.dumps({"job_id": made.job_id}), 3600)
    forget_job_events(connection, "job-a", "alpha", runs=1, memory_s=3600)
    # a retry promoted at the moment of the erasure: the event is in the outbox, body inside
    late = Delivery(erased, json.dumps({"job_id": "job-a"}), tries=1, first_try_at=time.time())
    connection.xadd(keys.WEBHOOK_OUTBOX, {"delivery": late.to_json()})
    with dispatching(connection, settings, bodies=None):
        wait_for(lambda: [c.headers["webhook-id"] for c in receiver.calls], 30, "job-b told")
        wait_for(lambda: connection.xlen(keys.WEBHOOK_OUTBOX) == 0, 30, "the outbox empty")
    assert [c.headers["webhook-id"] for c in receiver.calls] == [kept.webhook_id]
    assert connection.hlen(keys.WEBHOOK_DEAD) == 0
