"""An erasure forgets the webhook events of what it erases (producer/erasure.py).

A job's or a document's event carries its status: the result's `uri`, the request's
`metadata` and `idempotency_key`, a failure's message. Copies of it wait in several places
until delivered or dropped: the body kept for a job's event (`keys.WEBHOOK_BODY_PREFIX`, for
COSYQ_WEBHOOK_EVENT_MEMORY_HOURS), a delivery waiting for its next try (`keys.WEBHOOK_RETRY`,
the body inside), a dead letter (`keys.WEBHOOK_DEAD`, the body inside, for
COSYQ_FAILURE_TTL_S), a document's event in the outbox (its body in the entry). An erasure
removes each of them, and leaves in place of a job event's body a marker of the same life
(`{"tenant", "erased": true}`) that a dispatcher holding the event reads as "drop it" (its body
is gone; the job too): an event not yet delivered is not delivered after the erasure. A
delivery already on its way at that moment (a dispatcher holding its body) may still arrive.
"""

from __future__ import annotations

import json
from typing import Any, get_args

import redis

from shared import keys
from shared.webhooks import JobOutcome, WebhookEvent, event_id, unkept_member

JOB_OUTCOMES: tuple[JobOutcome, ...] = get_args(JobOutcome)
OUTBOX_PAGE = 500  # outbox entries read per XRANGE while looking for the erased ones


def forget_job_events(
    connection: redis.Redis, job_id: str, tenant: str, runs: int, memory_s: int
) -> None:
    """Forget every event of `job_id` (each outcome of each of its `runs`)."""
    with connection.pipeline() as pipe:
        for run in range(1, max(1, runs) + 1):
            for outcome in JOB_OUTCOMES:
                webhook_id = event_id(job_id, outcome, run)
                if connection.exists(keys.WEBHOOK_EVENT_SEEN_PREFIX + webhook_id):
                    marker = json.dumps({"tenant": tenant, "erased": True})
                    pipe.set(keys.WEBHOOK_BODY_PREFIX + webhook_id, marker, ex=max(1, memory_s))
                event = WebhookEvent(webhook_id, outcome, job_id, "", "", tenant)
                pipe.zrem(keys.WEBHOOK_UNKEPT, unkept_member(event))
        pipe.execute()
    _forget_copies(connection, job_id)


def forget_document_events(connection: redis.Redis, document_id: str) -> None:
    """Forget every event of `document_id` (their bodies travel in their entries)."""
    _forget_copies(connection, document_id)


def was_erased(connection: redis.Redis, webhook_id: str) -> bool:
    """Whether the subject of the event `webhook_id` was erased (its body replaced by the
    marker): the event is dropped, never sent."""
    raw = connection.get(keys.WEBHOOK_BODY_PREFIX + webhook_id)
    if raw is None:
        return False
    kept = json.loads(raw)
    return isinstance(kept, dict) and kept.get("erased") is True


def _forget_copies(connection: redis.Redis, subject_id: str) -> None:
    """The subject's deliveries waiting for a retry, its dead letters, its outbox entries."""
    prefix = f"msg_{subject_id}_"
    waiting = [
        member
        for member, _ in connection.zscan_iter(keys.WEBHOOK_RETRY, match=f"*{prefix}*")
        if _subject_of(member) == subject_id
    ]
    dead = [field for field, _ in connection.hscan_iter(keys.WEBHOOK_DEAD, match=f"{prefix}*")]
    entries = _outbox_entries_of(connection, subject_id)
    with connection.pipeline() as pipe:
        if waiting:
            pipe.zrem(keys.WEBHOOK_RETRY, *waiting)
        if dead:
            pipe.hdel(keys.WEBHOOK_DEAD, *dead)
            pipe.zrem(keys.WEBHOOK_DEAD_AT, *dead)
        if entries:
            pipe.xack(keys.WEBHOOK_OUTBOX, keys.WEBHOOK_GROUP, *entries)
            pipe.xdel(keys.WEBHOOK_OUTBOX, *entries)
        pipe.execute()


def _outbox_entries_of(connection: redis.Redis, subject_id: str) -> list[Any]:
    """The outbox entries (not yet delivered or dead) of the job or document `subject_id`."""
    found, start = [], "-"
    while True:
        page: Any = connection.xrange(keys.WEBHOOK_OUTBOX, min=start, count=OUTBOX_PAGE)
        for entry_id, fields in page:
            named = {_text(name): value for name, value in fields.items()}
            if "delivery" in named:  # a retry come due or a dead letter sent again
                if _subject_of(named["delivery"]) == subject_id:
                    found.append(entry_id)
            elif _text(named.get("job_id", b"")) == subject_id:
                found.append(entry_id)
        if len(page) < OUTBOX_PAGE:
            return found
        start = "(" + _text(page[-1][0])


def _subject_of(member: Any) -> str | None:
    try:
        event = json.loads(_text(member)).get("event", {})
    except (ValueError, AttributeError):
        return None
    return event.get("job_id") if isinstance(event, dict) else None


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)
