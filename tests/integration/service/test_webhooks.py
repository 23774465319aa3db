"""Worker side of webhooks: a job that ends for good leaves one outbox event (finished, or failed
after its retries), the dispatcher sends the job's status JSON, and a URL outside the worker's own
allow-list is never recorded, whatever the queue says. Every terminal state, whoever writes it
(the reaper, a batch's cancel before start), is told; a job that ends twice is told once, under
one webhook-id (issue 45 items 6, 7); an event goes only with its own tenant's job (issue 44)."""

from __future__ import annotations

import json
import signal
import sys
import threading
from collections.abc import Iterator
from datetime import datetime

import pytest
import redis
from rq import Retry
from rq.job import Job
from rq.serializers import JSONSerializer
from standardwebhooks.webhooks import Webhook

from producer.monitor import requeue_failed
from producer.tracking import job_status, status_record
from producer.webhooks.dispatcher import WebhookDispatcher
from producer.webhooks.store import WebhookStore
from shared import keys
from shared.settings import load_settings
from shared.tenants import TENANT_META_KEY
from shared.webhooks import tenant_secret
from tests.doubles.harness import Cluster, all_done, enqueue, json_queue, wait_for
from tests.doubles.webhook_receiver import Receiver, webhook_receiver

SECRET = "whsec_" + "c2VjcmV0LWZvci10ZXN0cy1vbmx5LTMyLWJ5dGVzISE="


def deliver_all(connection: redis.Redis, redis_url: str, receiver: Receiver, count: int) -> None:
    """Run a real dispatcher until the outbox is empty and `receiver` has `count` calls."""
    settings = load_settings(
        env_file=None,
        redis_url=redis_url,
        webhook_secret=SECRET,
        webhook_allow_private=True,
        webhook_poll_s=0.1,  # its stop seen within 0.1 s, not the default 0.5 s
    )
    stop = threading.Event()
    thread = threading.Thread(target=WebhookDispatcher(connection, settings).run, args=(stop,))
    thread.start()
    try:
        wait_for(lambda: WebhookStore(connection).counts()[0] == 0, 30, "nothing left to send")
        wait_for(lambda: len(receiver.calls) >= count, 60, f"{count} deliveries")
    finally:
        stop.set()
        thread.join(timeout=30)
    assert len(receiver.calls) == count


@pytest.fixture
def receiver(cluster: Cluster) -> Iterator[Receiver]:
    with webhook_receiver() as made:
        cluster.overrides["COSYQ_WEBHOOK_ALLOWED_URLS"] = made.url
        cluster.overrides["COSYQ_WEBHOOK_ALLOW_PRIVATE"] = "1"  # the receiver is on loopback
        yield made


def outbox(connection: redis.Redis) -> list[dict[str, str]]:
    entries = connection.xrange(keys.WEBHOOK_OUTBOX)
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


def test_finished_and_failed_jobs_are_told_once_each(
    cluster: Cluster, connection: redis.Redis, receiver: Receiver, redis_url: str
) -> None:
    hook = {"url": receiver.url + "done"}
    good = enqueue(connection, "fine", webhook=hook)
    bad = enqueue(connection, "invalid please", webhook=hook)
    silent = enqueue(connection, "no webhook here")
    outside = enqueue(connection, "fine", webhook={"url": "https://elsewhere.example.com/"})
    worker = cluster.start("run", "--burst", log_name="w.log")
    assert worker.wait(timeout=90) == 0
    assert all_done(connection, [good, silent], ("finished",))()
    assert all_done(connection, [bad, outside], ("failed",))()
    assert "COSYQ_WEBHOOK_ALLOWED_URLS" in outside.meta["cosyq_error"]["message"]
    events = sorted((e["job_id"], e["event"]) for e in outbox(connection))
    assert events == sorted([(good.id, "job.finished"), (bad.id, "job.failed")])

    deliver_all(connection, redis_url, receiver, 2)
    bodies = {}
    for call in receiver.calls:
        assert call.path == "/hooks/done"
        body = Webhook(SECRET).verify(call.body, call.headers)
        bodies[body["job_id"]] = body
    assert bodies[good.id]["state"] == "finished"
    assert bodies[good.id]["result"]["uri"].startswith("file://")
    assert bodies[bad.id]["state"] == "failed"
    assert bodies[bad.id]["error"]["kind"] == "invalid_request"
    assert json.loads(receiver.calls[0].body)  # plain JSON on the wire


def test_an_event_first_tried_after_its_job_expired_is_still_told(
    cluster: Cluster, connection: redis.Redis, receiver: Receiver, redis_url: str
) -> None:
    """A dispatcher down longer than COSYQ_RESULT_TTL_S: the job and its result are gone when
    the event is first tried, and the body its worker kept when it recorded the outcome goes,
    the job's status as it was then (the same as `GET /v1/jobs/{id}`), and when it ended."""
    cluster.overrides["COSYQ_RESULT_TTL_S"] = "2"
    job = enqueue(connection, "fine", webhook={"url": receiver.url})
    assert cluster.start("run", "--burst", log_name="w.log").wait(timeout=90) == 0
    assert all_done(connection, [job], ("finished",))()
    then = status_record(job_status(Job.fetch(job.id, connection, serializer=JSONSerializer)))
    wait_for(lambda: not connection.exists(job.key), 30, "the job to expire")
    deliver_all(connection, redis_url, receiver, 1)
    (call,) = receiver.calls
    assert call.headers["webhook-id"] == f"msg_{job.id}_finished"
    body = Webhook(SECRET).verify(call.body, call.headers)
    assert body.pop("occurred_at") == then["ended_at"]
    assert body == then and then["result"]["uri"].startswith("file://")
    assert WebhookStore(connection).dead_letters() == {}
    kept_s = connection.ttl(keys.WEBHOOK_BODY_PREFIX + f"msg_{job.id}_finished")
    assert 71 * 3600 < kept_s <= 72 * 3600  # as long as the id: COSYQ_WEBHOOK_EVENT_MEMORY_HOURS


def test_a_retried_job_is_told_only_when_it_ends(
    cluster: Cluster, connection: redis.Redis, receiver: Receiver, tmp_path
) -> None:
    marker = tmp_path / "fault-once"
    job = enqueue(
        connection, f"transient:{marker} hello", webhook={"url": receiver.url}, retry=None
    )
    worker = cluster.start("run", "--burst", log_name="w.log")
    assert worker.wait(timeout=90) == 0
    assert all_done(connection, [job], ("finished",))()
    (only,) = outbox(connection)
    assert only["event"] == "job.finished" and only["webhook_id"] == f"msg_{job.id}_finished"


def test_a_job_the_reaper_fails_is_told(
    cluster: Cluster, connection: redis.Redis, receiver: Receiver, redis_url: str
) -> None:
    cluster.overrides["COSYQ_MAX_RETRIES"] = "0"
    job = enqueue(connection, "kill poison", webhook={"url": receiver.url})
    assert cluster.start("run", log_name="a.log").wait(timeout=60) == -signal.SIGKILL
    cluster.start("run", log_name="b.log")  # its reaper fails the job: no retries left
    wait_for(lambda: job.get_status() == "failed", 30, "the reaper to fail the job")
    # the reaper keeps the event's body just after the outcome it records: deleted before
    # that, the job takes its body with it (a race of the test's, not a job's 24 h life)
    body_key = keys.WEBHOOK_BODY_PREFIX + f"msg_{job.id}_failed"
    wait_for(lambda: connection.exists(body_key), 30, "the reaper to keep the body")
    connection.delete(job.key)  # as if it expired: the body the reaper kept goes
    deliver_all(connection, redis_url, receiver, 1)
    (call,) = receiver.calls
    assert call.headers["webhook-id"] == f"msg_{job.id}_failed"
    body = Webhook(SECRET).verify(call.body, call.headers)
    assert (body["job_id"], body["state"]) == (job.id, "failed")
    assert body["error"]["kind"] == "worker_died"


def test_a_job_canceled_between_pop_and_start_is_told(
    cluster: Cluster, connection: redis.Redis, receiver: Receiver, worker_batch_size: int
) -> None:
    """Popped alone (batch1) or while a batch window runs (batch8: `_admit_popped`)."""
    # the window held open by a 2 s job; one job at a time pops the canceled one after it
    window = "sleep:2 " if worker_batch_size > 1 else ""
    running = enqueue(connection, f"{window}a batch window is open meanwhile")
    job = enqueue(connection, "fine", webhook={"url": receiver.url})
    connection.set(keys.cancel_key(job.id), "1")  # canceled after it was queued, before a start
    assert cluster.start("run", "--burst", log_name="w.log").wait(timeout=90) == 0
    assert all_done(connection, [running], ("finished",))()
    assert all_done(connection, [job], ("canceled",))()
    assert [(e["job_id"], e["event"]) for e in outbox(connection)] == [(job.id, "job.canceled")]
    assert connection.exists(keys.WEBHOOK_BODY_PREFIX + f"msg_{job.id}_canceled")


def test_a_job_that_ends_twice_is_told_once_under_one_id(
    cluster: Cluster, connection: redis.Redis, receiver: Receiver, redis_url: str
) -> None:
    job = enqueue(connection, "fine", webhook={"url": receiver.url}, retry=Retry(max=1))
    command = [sys.executable, "-m", "rq.cli", "worker", "--url", redis_url, "--burst"]
    command += ["-w", "tests.doubles.racy_workers.KillAfterWebhookEvent"]
    command += ["-S", "rq.serializers.JSONSerializer", "cosyq-default"]
    assert cluster.spawn(command, "killed.log").wait(timeout=90) == -signal.SIGKILL
    assert len(outbox(connection)) == 1  # appended, and then the worker died
    cluster.start("run", log_name="b.log")  # reaps the job, runs it again, finishes it
    wait_for(lambda: job.get_status() == "finished", 60, "the job finished again")
    job.refresh()
    assert job.meta[keys.ATTEMPT_META_KEY] == 2
    (only,) = outbox(connection)
    assert only["webhook_id"] == f"msg_{job.id}_finished"
    connection.delete(job.key)  # as if it expired: the second end kept the first event's body
    deliver_all(connection, redis_url, receiver, 1)
    body = Webhook(SECRET).verify(receiver.calls[0].body, receiver.calls[0].headers)
    assert (body["job_id"], body["state"]) == (job.id, "finished")


def test_an_event_goes_only_with_its_own_tenants_job(
    cluster: Cluster, connection: redis.Redis, receiver: Receiver, redis_url: str
) -> None:
    cluster.overrides["COSYQ_TENANTS"] = "alpha,beta"
    queue = json_queue(connection, "cosyq-default.alpha")
    jobs = [
        queue.enqueue(
            "workers.tasks.synthesize",
            request={"text": "fine", "webhook": {"url": receiver.url + name}},
            meta={TENANT_META_KEY: "alpha"},
        )
        for name in ("kept", "retagged")
    ]
    assert cluster.start("run", "--burst", log_name="w.log").wait(timeout=90) == 0
    assert all_done(connection, jobs, ("finished",))()
    assert {e["tenant"] for e in outbox(connection)} == {"alpha"}
    kept, retagged = jobs
    retagged.meta[TENANT_META_KEY] = "beta"  # the id now names another tenant's job
    retagged.save_meta()
    deliver_all(connection, redis_url, receiver, 1)
    (call,) = receiver.calls
    assert call.path.endswith("/kept")
    body = Webhook(tenant_secret(SECRET, "alpha")).verify(call.body, call.headers)
    assert (body["job_id"], body["tenant"]) == (kept.id, "alpha")
    (dead,) = WebhookStore(connection).dead_letters().values()
    assert "does not belong to the event's tenant 'alpha'" in json.loads(dead)["dead_reason"]


def test_a_failed_job_requeued_by_hand_is_told_again_under_a_new_id(
    cluster: Cluster, connection: redis.Redis, receiver: Receiver, redis_url: str
) -> None:
    """Each end told with its own body, the second one's `occurred_at` later: a receiver orders
    the two by it, whenever they are sent."""
    job = enqueue(connection, "invalid please", webhook={"url": receiver.url})
    assert cluster.start("run", "--burst", log_name="a.log").wait(timeout=90) == 0
    assert all_done(connection, [job], ("failed",))()
    assert requeue_failed(connection, [job.id]) == [job.id]
    assert cluster.start("run", "--burst", log_name="b.log").wait(timeout=90) == 0
    assert all_done(connection, [job], ("failed",))()
    ids = [e["webhook_id"] for e in outbox(connection)]
    assert ids == [f"msg_{job.id}_failed", f"msg_{job.id}_failed_r2"]
    deliver_all(connection, redis_url, receiver, 2)
    told = {
        c.headers["webhook-id"]: Webhook(SECRET).verify(c.body, c.headers) for c in receiver.calls
    }
    first, second = (told[name]["occurred_at"] for name in ids)
    assert datetime.fromisoformat(first) < datetime.fromisoformat(second)


def test_a_waiting_job_canceled_by_the_producer_is_told(
    cluster: Cluster, connection: redis.Redis, receiver: Receiver, redis_url: str
) -> None:
    """A queued job canceled by `client.cancel` never reaches a worker (RQ's Job.cancel takes
    it out of its queue): the producer tells its `job.canceled`, once however often it asks."""
    from producer import CosyqClient  # noqa: PLC0415

    job = enqueue(connection, "never runs", webhook={"url": receiver.url})
    settings = load_settings(
        env_file=None,
        redis_url=redis_url,
        webhook_allowed_urls=receiver.url,
        webhook_allow_private=True,
    )
    with CosyqClient(settings) as client:
        assert client.cancel(job.id).verdict == "canceled"
        assert client.cancel(job.id).verdict == "already_canceled"
    assert [(e["job_id"], e["event"]) for e in outbox(connection)] == [(job.id, "job.canceled")]
    connection.delete(job.key)  # as if it expired: the body the producer kept goes
    deliver_all(connection, redis_url, receiver, 1)
    (call,) = receiver.calls
    assert call.headers["webhook-id"] == f"msg_{job.id}_canceled"
    body = Webhook(SECRET).verify(call.body, call.headers)
    assert (body["job_id"], body["state"]) == (job.id, "canceled")
    assert body["ended_at"] is None and body["occurred_at"]  # RQ's cancel sets no ended_at


@pytest.mark.parametrize("expired", [False, True], ids=["kept", "expired"])
def test_a_job_told_finished_that_the_reaper_fails_sends_only_its_failure(
    cluster: Cluster, connection: redis.Redis, receiver: Receiver, redis_url: str, expired: bool
) -> None:
    """The worker appended `job.finished` and died before RQ recorded it; with no retry left
    the reaper fails the job (`worker_died`) and appends `job.failed`. The job has one outcome:
    its receiver hears `failed` once, never a `finished` whose body says failed, also when the
    job is gone by the first try (the `job.failed` body kept says how it ended)."""
    cluster.overrides["COSYQ_MAX_RETRIES"] = "0"
    job = enqueue(connection, "fine", webhook={"url": receiver.url})
    command = [sys.executable, "-m", "rq.cli", "worker", "--url", redis_url, "--burst"]
    command += ["-w", "tests.doubles.racy_workers.KillAfterWebhookEvent"]
    command += ["-S", "rq.serializers.JSONSerializer", "cosyq-default"]
    assert cluster.spawn(command, "killed.log").wait(timeout=90) == -signal.SIGKILL
    cluster.start("run", log_name="b.log")  # its reaper fails the job: no retries left
    wait_for(lambda: job.get_status() == "failed", 60, "the reaper to fail the job")
    assert [e["event"] for e in outbox(connection)] == ["job.finished", "job.failed"]
    if expired:
        connection.delete(job.key)
    deliver_all(connection, redis_url, receiver, 1)
    (call,) = receiver.calls
    assert call.headers["webhook-id"] == f"msg_{job.id}_failed"
    body = Webhook(SECRET).verify(call.body, call.headers)
    assert (body["state"], body["error"]["kind"]) == ("failed", "worker_died")
    assert WebhookStore(connection).dead_letters() == {}
