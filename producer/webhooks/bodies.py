"""A job event's body, fixed when the job's outcome is recorded and kept as long as its id.

RQ keeps a job `COSYQ_RESULT_TTL_S` (a failed one `COSYQ_FAILURE_TTL_S`); a dispatcher that is
down longer must still send its events. So whoever records a job's outcome (the worker, the
reaper, the producer's cancel of a waiting job) keeps, right after, the event's body: the job's
status JSON (`GET /v1/jobs/{id}`) and `occurred_at`, under `cosyq:webhooks:body:<webhook id>`
for COSYQ_WEBHOOK_EVENT_MEMORY_HOURS (as long as the outbox remembers the id), with the tenant
whose job it is. Set once (NX): every delivery of the event carries the same bytes.

It is kept only when the job, read back, ended as the event says and is the event's tenant's.
The dispatcher sends a kept body only for an event of the same tenant, and only while the job,
if it is still in Redis, belongs to that tenant: an id that another tenant's job took after the
first one expired never carries the first one's body to the second, nor the second's to the
first. The event is noted unkept when it is appended (before the outcome, in the same step:
`shared.webhooks.append_event`), and keeping its body removes the note in the same transaction
(`settle`). A recorder that dies (or loses Redis) between the outcome and the keep leaves the
note, and the workers' housekeeping keeps the body from it once the job has ended
(`keep_unkept`, workers/service/webhook_bodies.py), a heartbeat or two later, long before the
job expires. With no worker running, the event takes its body from the job at its first try
(sent while the job is kept); the dispatcher keeps that body the same way (`settle`: the first
kept wins), so a delivery taken over from a dispatcher that died carries the same bytes whoever
kept it.

No HTTP client here: workers import it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import redis
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.utils import utcformat, utcparse

from producer.tracking import TERMINAL_STATES, JobStatus, job_status, status_record
from shared import keys
from shared.job_events import WebhookPolicy, job_event
from shared.logs import get_logger
from shared.webhooks import EventName, WebhookEvent, event_id, unkept_member

log = get_logger(__name__)

# The job states each job event may tell.
EVENT_STATES: dict[EventName, frozenset[str]] = {
    "job.finished": frozenset({"finished"}),
    "job.failed": frozenset({"failed", "stopped"}),
    "job.canceled": frozenset({"canceled"}),
}


def event_body(status: JobStatus, event: WebhookEvent) -> str:
    """The JSON a job's event sends: the job's status record and `occurred_at`, when the job
    ended (its `ended_at`; a job canceled while it waited has none: when the event was made)."""
    record: dict[str, Any] = status_record(status)
    record["occurred_at"] = record["ended_at"] or _iso(event.at)
    return json.dumps(record, ensure_ascii=False, sort_keys=True)


def _iso(at: str) -> str:
    """RQ's UTC format (`...Z`) as the API shows times (`...+00:00`); as it is when not."""
    try:
        return utcparse(at).isoformat()
    except ValueError:
        return at


def tells(status: JobStatus, event: WebhookEvent) -> bool:
    """Whether `status` is an end `event` tells (its state among the event's)."""
    return status.state in EVENT_STATES.get(event.event, {status.state})


def keep_body(connection: redis.Redis, job: Job, event: EventName, policy: WebhookPolicy) -> None:
    """After `job`'s outcome was recorded: keep its `event`'s body (when it has a webhook, ended
    so and is still its tenant's). Best effort: a Redis error is logged, the outcome stands and
    the housekeeping keeps the body later (`keep_unkept`), else the dispatcher at its first try."""
    made = job_event(job, event, policy, quiet=True)
    if made is None:
        return
    try:
        _keep(connection, made, policy.memory_s)
    except (redis.RedisError, NoSuchJobError) as e:
        log.warning("webhook_body_unkept", job_id=job.id, error=str(e))


def keep_unkept(connection: redis.Redis, member: str, noted_at: float, memory_s: int) -> bool:
    """The workers' housekeeping looks at an event noted unkept (`shared.webhooks.unkept_member`,
    appended with the event before its outcome, `noted_at`): keeps its body from the job as
    `keep_body` would have. True when done with it (kept, or never to be: the job gone, ended
    otherwise, rerun, not the event's tenant's: the entry is dropped); False while the job has
    not ended (its recorder may still be writing the outcome: looked at again later)."""
    fields = json.loads(member)
    at = utcformat(datetime.fromtimestamp(noted_at, UTC))
    event = WebhookEvent(
        fields["webhook_id"], fields["event"], fields["job_id"], "", at, fields["tenant"]
    )
    try:
        return _keep(connection, event, memory_s) is not None
    except NoSuchJobError:
        log.warning("webhook_body_lost", webhook_id=event.webhook_id, job_id=event.job_id)
        connection.zrem(keys.WEBHOOK_UNKEPT, member)
        return True


def _keep(connection: redis.Redis, event: WebhookEvent, memory_s: int) -> bool | None:
    """Keep `event`'s body from its job as it is now: True (kept, or kept first by another),
    False when it never will be (the entry is dropped), None while the job has not ended."""
    read = Job.fetch(event.job_id, connection=connection, serializer=JSONSerializer)
    status = job_status(read)
    run = read.meta.get(keys.RUN_META_KEY, 1)
    this_run = event_id(read.id, event.event, run if isinstance(run, int) else 1)
    if status.state not in TERMINAL_STATES and this_run == event.webhook_id:
        return None
    if status.tenant != event.tenant or not tells(status, event) or this_run != event.webhook_id:
        log.info("webhook_body_not_kept", job_id=event.job_id, state=status.state)
        connection.zrem(keys.WEBHOOK_UNKEPT, unkept_member(event))
        return False
    settle(connection, event, event_body(status, event), memory_s)
    return True


def settle(connection: redis.Redis, event: WebhookEvent, body: str, memory_s: int) -> str:
    """Keep `body` for `event` unless a body was kept first; the one kept (for the event's
    tenant) wins, so whoever builds it, every delivery of the event carries the same bytes. The
    event is no longer noted unkept (in the same transaction)."""
    kept = json.dumps({"tenant": event.tenant, "body": body})
    key = keys.WEBHOOK_BODY_PREFIX + event.webhook_id
    with connection.pipeline() as pipe:
        pipe.set(key, kept, nx=True, ex=max(1, memory_s))
        pipe.zrem(keys.WEBHOOK_UNKEPT, unkept_member(event))
        pipe.execute()
    return kept_body(connection, event) or body


def told_otherwise(connection: redis.Redis, event: WebhookEvent) -> str | None:
    """Another outcome of the same run of `event`'s job whose body was kept for its tenant (the
    event's worker died after appending it, and the job then ended so), sent or not; None when
    there is none."""
    suffix = event.webhook_id.removeprefix(event_id(event.job_id, event.event))
    for other in EVENT_STATES:
        sibling = replace(event, webhook_id=event_id(event.job_id, other) + suffix, event=other)
        if other != event.event and _kept(connection, sibling) is not None:
            return other
    return None


def kept_body(connection: redis.Redis, event: WebhookEvent) -> str | None:
    """The body kept for `event`; None when none was, it was kept for another tenant, or the
    event was delivered (`spend`)."""
    kept = _kept(connection, event)
    body = kept.get("body") if kept is not None else None
    return body if isinstance(body, str) else None


def spend(connection: redis.Redis, event: WebhookEvent) -> None:
    """After the receiver took `event`: its kept body gives way to a marker of the same life
    (the tenant and `sent`), so a delivered event holds a few bytes in Redis for the rest of
    COSYQ_WEBHOOK_EVENT_MEMORY_HOURS, not its body, and is never sent again."""
    if _kept(connection, event) is not None:
        marker = json.dumps({"tenant": event.tenant, "sent": True})
        connection.set(keys.WEBHOOK_BODY_PREFIX + event.webhook_id, marker, xx=True, keepttl=True)


def was_sent(connection: redis.Redis, event: WebhookEvent) -> bool:
    """Whether `event` was delivered and booked (`spend`)."""
    kept = _kept(connection, event)
    return kept is not None and kept.get("sent") is True


def _kept(connection: redis.Redis, event: WebhookEvent) -> dict[str, Any] | None:
    """What was kept for `event` (a body, or the marker of one sent) when it was kept for the
    event's tenant; None otherwise."""
    raw = connection.get(keys.WEBHOOK_BODY_PREFIX + event.webhook_id)
    if raw is None or not event.tenant:
        return None
    kept = json.loads(raw)
    if not isinstance(kept, dict) or kept.get("tenant") != event.tenant:
        return None
    return kept
