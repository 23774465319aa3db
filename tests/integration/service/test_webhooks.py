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

import pytest
import redis
from rq import Retry
from standardwebhooks.webhooks import Webhook

from producer.monitor import requeue_failed
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
        wait_for(lambda: len(receiver.calls) >= count, 10, f"{count} deliveries")
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
    deliver_all(connection, redis_url, receiver, 1)


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
    cluster: Cluster, connection: redis.Redis, receiver: Receiver
) -> None:
    job = enqueue(connection, "invalid please", webhook={"url": receiver.url})
    assert cluster.start("run", "--burst", log_name="a.log").wait(timeout=90) == 0
    assert all_done(connection, [job], ("failed",))()
    assert requeue_failed(connection, [job.id]) == [job.id]
    assert cluster.start("run", "--burst", log_name="b.log").wait(timeout=90) == 0
    assert all_done(connection, [job], ("failed",))()
    ids = [e["webhook_id"] for e in outbox(connection)]
    assert ids == [f"msg_{job.id}_failed", f"msg_{job.id}_failed_r2"]


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
    deliver_all(connection, redis_url, receiver, 1)
    (call,) = receiver.calls
    assert call.headers["webhook-id"] == f"msg_{job.id}_canceled"
    body = Webhook(SECRET).verify(call.body, call.headers)
    assert (body["job_id"], body["state"]) == (job.id, "canceled")


def test_a_job_told_finished_that_the_reaper_fails_sends_only_its_failure(
    cluster: Cluster, connection: redis.Redis, receiver: Receiver, redis_url: str
) -> None:
    """The worker appended `job.finished` and died before RQ recorded it; with no retry left
    the reaper fails the job (`worker_died`) and appends `job.failed`. The job has one outcome:
    its receiver hears `failed` once, never a `finished` whose body says failed."""
    cluster.overrides["COSYQ_MAX_RETRIES"] = "0"
    job = enqueue(connection, "fine", webhook={"url": receiver.url})
    command = [sys.executable, "-m", "rq.cli", "worker", "--url", redis_url, "--burst"]
    command += ["-w", "tests.doubles.racy_workers.KillAfterWebhookEvent"]
    command += ["-S", "rq.serializers.JSONSerializer", "cosyq-default"]
    assert cluster.spawn(command, "killed.log").wait(timeout=90) == -signal.SIGKILL
    cluster.start("run", log_name="b.log")  # its reaper fails the job: no retries left
    wait_for(lambda: job.get_status() == "failed", 60, "the reaper to fail the job")
    assert [e["event"] for e in outbox(connection)] == ["job.finished", "job.failed"]
    deliver_all(connection, redis_url, receiver, 1)
    (call,) = receiver.calls
    assert call.headers["webhook-id"] == f"msg_{job.id}_failed"
    body = Webhook(SECRET).verify(call.body, call.headers)
    assert (body["state"], body["error"]["kind"]) == ("failed", "worker_died")
    assert WebhookStore(connection).dead_letters() == {}
