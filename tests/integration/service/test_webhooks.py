"""Worker side of webhooks: a job that ends for good leaves one outbox event (finished, or failed
after its retries), the dispatcher sends the job's status JSON, and a URL outside the worker's own
allow-list is never recorded, whatever the queue says."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest
import redis
from standardwebhooks.webhooks import Webhook

from producer.webhooks.dispatcher import WebhookDispatcher
from producer.webhooks.store import WebhookStore
from shared import keys
from shared.settings import load_settings
from tests.doubles.harness import Cluster, all_done, enqueue, wait_for
from tests.doubles.webhook_receiver import Receiver, webhook_receiver

SECRET = "whsec_" + "c2VjcmV0LWZvci10ZXN0cy1vbmx5LTMyLWJ5dGVzISE="


@pytest.fixture
def receiver(cluster: Cluster) -> Iterator[Receiver]:
    with webhook_receiver() as made:
        cluster.overrides["COSYQ_WEBHOOK_ALLOWED_URLS"] = made.url
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

    settings = load_settings(
        env_file=None, redis_url=redis_url, webhook_secret=SECRET, webhook_allow_private=True
    )
    stop = threading.Event()
    thread = threading.Thread(target=WebhookDispatcher(connection, settings).run, args=(stop,))
    thread.start()
    try:
        wait_for(lambda: len(receiver.calls) == 2, 30, "both events delivered")
        wait_for(lambda: WebhookStore(connection).counts() == (0, 0), 10, "the outbox empty")
    finally:
        stop.set()
        thread.join(timeout=30)
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
    assert only["event"] == "job.finished" and only["webhook_id"] == f"msg_{job.id}_finished_2"
