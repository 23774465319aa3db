"""A job event's kept body (producer/webhooks/bodies.py) against a real Redis, real RQ jobs and
the real dispatcher and receiver: kept only for an end the event tells, once (the same bytes
however often it is kept), and sent only for an event of the tenant it was kept for and only
while the job, if it is still in Redis, is that tenant's."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import redis
from rq.job import Job, JobStatus

from producer.webhooks.bodies import keep_body
from producer.webhooks.store import WebhookStore
from shared import keys
from shared.job_events import WebhookPolicy, job_ended, job_event
from shared.settings import Settings
from shared.tenants import TENANT_META_KEY
from shared.webhooks import WebhookEvent, unkept_member
from tests.doubles.harness import json_queue, wait_for
from tests.doubles.webhook_receiver import Receiver
from tests.integration.producer.webhook_rig import (  # noqa: F401 (fixtures used by name)
    append,
    connection_fixture,
    dispatching,
    receiver_fixture,
    settings_fixture,
)
from workers.service.webhook_bodies import UnkeptBodies


def job_of(connection: redis.Redis, tenant: str, url: str, job_id: str | None = None) -> Job:
    request = {"text": "fine", "webhook": {"url": url}}
    queue = json_queue(connection)
    meta = {TENANT_META_KEY: tenant}
    return queue.enqueue("workers.tasks.synthesize", request=request, meta=meta, job_id=job_id)


def kept(connection: redis.Redis, webhook_id: str) -> dict[str, str] | None:
    raw = connection.get(keys.WEBHOOK_BODY_PREFIX + webhook_id)
    return json.loads(raw) if raw is not None else None


def test_a_body_is_kept_once_and_only_for_an_end_the_event_tells(
    connection: redis.Redis, receiver: Receiver
) -> None:
    policy = WebhookPolicy(allowed=(receiver.url,), memory_s=600, allow_private=True)
    job = job_of(connection, "alpha", receiver.url)
    keep_body(connection, job, "job.finished", policy)  # still queued: no end yet
    assert kept(connection, f"msg_{job.id}_finished") is None
    job.set_status(JobStatus.CANCELED)
    keep_body(connection, job, "job.finished", policy)  # canceled: not what the event tells
    assert kept(connection, f"msg_{job.id}_finished") is None
    keep_body(connection, job, "job.canceled", policy)
    first = kept(connection, f"msg_{job.id}_canceled")
    assert first is not None and first["tenant"] == "alpha"
    body = json.loads(first["body"])
    assert (body["job_id"], body["state"], body["tenant"]) == (job.id, "canceled", "alpha")
    moment = datetime.fromisoformat(body["occurred_at"])  # no ended_at: when it was kept
    assert moment.utcoffset() == timedelta(0)
    assert 0 < connection.ttl(keys.WEBHOOK_BODY_PREFIX + f"msg_{job.id}_canceled") <= 600
    job.meta["cosyq_submit"] = {"changed": True}  # kept again later: the first stays
    job.save_meta()
    keep_body(connection, job, "job.canceled", policy)
    assert kept(connection, f"msg_{job.id}_canceled") == first


def test_a_kept_body_goes_only_with_its_own_tenants_event_and_job(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    """`gone`: the job expired, its body kept: sent. `taken`: the job expired and beta's job
    took its id: alpha's event is not sent (the job is beta's now). `overwritten`: only a body
    kept for beta under the id: alpha's event is not sent with it."""
    bodies = {"gone": "alpha", "taken": "alpha", "overwritten": "beta"}
    for job_id, tenant in bodies.items():
        made = WebhookEvent.for_job("job.finished", job_id, receiver.url, "2026-12-01Z", "alpha")
        append(connection, made)
        body = json.dumps({"job_id": job_id, "state": "finished", "tenant": tenant})
        connection.set(
            keys.WEBHOOK_BODY_PREFIX + made.webhook_id, json.dumps({"tenant": tenant, "body": body})
        )
    job_of(connection, "beta", receiver.url, job_id="taken")
    with dispatching(connection, settings, None):
        wait_for(lambda: WebhookStore(connection).counts() == (0, 2), 30, "two dead letters")
        wait_for(lambda: len(receiver.calls) == 1, 10, "the kept body")
    (call,) = receiver.calls
    assert call.headers["webhook-id"] == "msg_gone_finished"
    assert json.loads(call.body) == {"job_id": "gone", "state": "finished", "tenant": "alpha"}
    dead = {
        k: json.loads(v)["dead_reason"] for k, v in WebhookStore(connection).dead_letters().items()
    }
    assert "does not belong to the event's tenant 'alpha'" in dead["msg_taken_finished"]
    assert "no body was kept" in dead["msg_overwritten_finished"]


def test_a_body_the_dispatcher_builds_is_kept_and_wins_over_a_later_keep(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    """The dispatcher tried the event before its recorder kept a body (between the outcome and
    the keep): the body it built is kept, and the recorder's keep leaves it, so a delivery of
    the event taken over after a dead dispatcher carries the same bytes."""
    job = job_of(connection, "alpha", receiver.url)
    job.set_status(JobStatus.CANCELED)
    at = "2026-12-01T00:00:00.000000Z"  # RQ's format, as every entry's
    append(connection, WebhookEvent.for_job("job.canceled", job.id, receiver.url, at, "alpha"))
    with dispatching(connection, settings, None):
        wait_for(lambda: len(receiver.calls) == 1, 30, "the event")
    (call,) = receiver.calls
    assert json.loads(call.body)["occurred_at"] == "2026-12-01T00:00:00+00:00"
    sent = kept(connection, f"msg_{job.id}_canceled")  # delivered: the marker took its place
    assert sent == {"tenant": "alpha", "sent": True}
    policy = WebhookPolicy(allowed=(receiver.url,), memory_s=600, allow_private=True)
    keep_body(connection, job, "job.canceled", policy)
    assert kept(connection, f"msg_{job.id}_canceled") == sent


def test_a_delivered_event_holds_a_marker_not_its_body_and_is_never_sent_again(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    """The receiver took the event: its kept body (kilobytes per job for the event memory's
    72 h) gives way to a marker with the same time to live, and an entry of the same event
    read again (a dispatcher that claimed it while the first one was booking it) is booked, not
    sent; its job's other outcome is still known to be told."""
    policy = WebhookPolicy(allowed=(receiver.url,), memory_s=600, allow_private=True)
    job = job_of(connection, "alpha", receiver.url)
    job.set_status(JobStatus.CANCELED)
    made = WebhookEvent.for_job("job.canceled", job.id, receiver.url, "2026-12-01Z", "alpha")
    append(connection, made)
    keep_body(connection, job, "job.canceled", policy)
    body = kept(connection, made.webhook_id)
    assert body is not None and "body" in body
    with dispatching(connection, settings, None):
        wait_for(lambda: len(receiver.calls) == 1, 30, "the event")
        wait_for(lambda: kept(connection, made.webhook_id) != body, 10, "the marker")
        assert kept(connection, made.webhook_id) == {"tenant": "alpha", "sent": True}
        assert 0 < connection.ttl(keys.WEBHOOK_BODY_PREFIX + made.webhook_id) <= 600
        flat = [part for pair in made.fields().items() for part in pair]
        connection.execute_command("XADD", keys.WEBHOOK_OUTBOX, "*", *flat)  # the same again
        wait_for(lambda: WebhookStore(connection).counts() == (0, 0), 30, "the copy booked")
    assert len(receiver.calls) == 1
    assert receiver.calls[0].body == body["body"]


def test_a_body_whose_recorder_died_before_keeping_it_is_kept_by_the_housekeeping(
    connection: redis.Redis, settings: Settings, receiver: Receiver
) -> None:
    """A waiting job canceled, its recorder dead after the outcome and before the keep, and the
    job expired before any dispatcher ran: the event went dead-lettered unsent (no body kept,
    no job to take one from). Now the event is noted unkept with its append, and a heartbeat
    later the workers' housekeeping keeps its body: the event is sent. A note whose job has
    not ended stays (looked at again); one whose job is gone is dropped."""
    policy = WebhookPolicy(allowed=(receiver.url,), memory_s=600, allow_private=True)
    canceled, running, gone = (job_of(connection, "alpha", receiver.url) for _ in range(3))
    job_ended(connection, canceled, "job.canceled", policy)
    canceled.cancel()  # the outcome; its recorder dies here, before keep_body
    for job in (running, gone):
        job_ended(connection, job, "job.finished", policy)
    gone.delete()
    member = {
        job.id: unkept_member(made)
        for job, name in (
            (canceled, "job.canceled"),
            (running, "job.finished"),
            (gone, "job.finished"),
        )
        if (made := job_event(job, name, policy)) is not None
    }
    notes = dict(connection.zrange(keys.WEBHOOK_UNKEPT, 0, -1, withscores=True))
    assert {m.decode() for m in notes} == set(member.values())
    a_beat_ago = {m: at - settings.heartbeat_interval_s - 1 for m, at in notes.items()}
    connection.zadd(keys.WEBHOOK_UNKEPT, a_beat_ago)  # as one heartbeat later

    done = UnkeptBodies(connection, settings, holder="test").tick()
    assert sorted(done) == sorted([member[canceled.id], member[gone.id]])
    assert connection.zrange(keys.WEBHOOK_UNKEPT, 0, -1) == [member[running.id].encode()]
    webhook_id = f"msg_{canceled.id}_canceled"
    assert (kept(connection, webhook_id) or {}).get("tenant") == "alpha"
    canceled.delete()  # the job expires before a dispatcher runs
    with dispatching(connection, settings, None):
        sent = lambda: [c for c in receiver.calls if c.headers["webhook-id"] == webhook_id]  # noqa: E731
        (call,) = wait_for(sent, 30, "the kept body sent")
    body = json.loads(call.body)
    assert (body["job_id"], body["state"], body["tenant"]) == (canceled.id, "canceled", "alpha")
    assert webhook_id not in WebhookStore(connection).dead_letters()
