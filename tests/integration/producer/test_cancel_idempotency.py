"""A cancel with an idempotency key (producer/cancel.py), on a real redis-server: its retries
answer as its first try did (never `already_canceled` for its own cancel), whether the first
try canceled a waiting job, was told `stopping`, or a worker canceled the job for its flag;
any other cancel (no key, another key, another tenant's same key) is a cancel of its own.
The retry after a lost answer and a 503, through a real front: test_front_crash.py."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import redis
from rq.job import Job, JobStatus

from producer.cancel import cancel_job, idempotency_digest
from producer.tracking import JobTracker
from shared import keys
from shared.errors import InvalidRequestError
from shared.settings import Settings, load_settings
from shared.tenants import TENANT_META_KEY
from tests.doubles.harness import json_queue
from tests.integration.producer.test_cancel_races import (
    POLICY,
    WorkerCancelsAfterFlag,
    told,
    waiting_job,
)
from workers.service import cancels

KEY = idempotency_digest("stop-order-7", "alpha")
SAME_KEY_CANCELS = 16


@pytest.fixture
def settings(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    return load_settings(env_file=None)


def cancel(connection: redis.Redis, settings: Settings, job_id: str, key: str | None) -> str:
    """One cancel (`key`: a digest, or None) as `verdict state`."""
    tracker = JobTracker(connection, settings)
    outcome = cancel_job(
        connection, tracker, job_id, flag_ttl_s=60, webhooks=POLICY, idempotency=key
    )
    return f"{outcome.verdict} {outcome.state}"


def test_a_keyed_cancel_of_a_scheduled_job_answers_its_retries_alike(
    redis_url: str, settings: Settings
) -> None:
    connection = redis.Redis.from_url(redis_url)
    meta = {TENANT_META_KEY: "alpha"}
    job = json_queue(connection).enqueue_in(
        timedelta(hours=1), keys.SYNTHESIZE_FUNCTION, request={"text": "later"}, meta=meta
    )
    assert cancel(connection, settings, job.id, KEY) == "canceled scheduled"
    assert cancel(connection, settings, job.id, KEY) == "canceled scheduled"
    assert cancel(connection, settings, job.id, None) == "already_canceled canceled"
    beta = idempotency_digest("stop-order-7", "beta")  # the same words, another tenant's key
    assert cancel(connection, settings, job.id, beta) == "already_canceled canceled"
    assert connection.ttl(keys.cancel_idempotency_key(job.id, KEY)) in range(1, 61)
    assert connection.smembers(keys.cancel_records_key(job.id)) == {KEY.encode()}  # erasure's
    assert connection.ttl(keys.cancel_records_key(job.id)) in range(1, 61)


def test_a_keyed_cancel_told_stopping_is_told_so_again_after_the_worker_stopped_it(
    redis_url: str, settings: Settings
) -> None:
    connection = redis.Redis.from_url(redis_url)
    job = waiting_job(connection)
    queue = json_queue(connection)
    queue.remove(job)
    job.set_status(JobStatus.STARTED)
    assert cancel(connection, settings, job.id, KEY) == "stopping started"
    cancels.record_canceled(connection, Job.fetch(job.id, connection=connection), queue)
    assert cancel(connection, settings, job.id, KEY) == "stopping started"
    assert cancel(connection, settings, job.id, None) == "already_canceled canceled"


def test_a_keyed_cancel_whose_job_a_worker_canceled_for_its_flag_is_canceled_on_retry(
    redis_url: str, settings: Settings
) -> None:
    """No verdict recorded (the worker did the work): the key's token in the hash decides."""
    connection = redis.Redis.from_url(redis_url)
    job = waiting_job(connection)
    racing = WorkerCancelsAfterFlag.from_url(redis_url)
    assert cancel(racing, settings, job.id, KEY) == "canceled queued"
    assert not connection.exists(keys.cancel_idempotency_key(job.id, KEY))
    assert cancel(connection, settings, job.id, KEY) == "canceled queued"
    assert cancel(connection, settings, job.id, None) == "already_canceled canceled"
    assert told(connection, job) == ["job.canceled"]


def test_cancels_with_one_key_at_once_all_say_canceled_and_tell_once(
    redis_url: str, settings: Settings
) -> None:
    connection = redis.Redis.from_url(redis_url)
    job = waiting_job(connection)
    start = threading.Barrier(SAME_KEY_CANCELS)
    answers: list[str] = []

    def one() -> None:
        own = redis.Redis.from_url(redis_url)
        start.wait()
        answers.append(cancel(own, settings, job.id, KEY))

    threads = [threading.Thread(target=one) for _ in range(SAME_KEY_CANCELS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == ["canceled queued"] * SAME_KEY_CANCELS
    assert told(connection, job) == ["job.canceled"]


@pytest.mark.parametrize("key", ["", "x" * 256, "tab\there"])
def test_a_key_a_submit_would_refuse_is_refused(key: str) -> None:
    with pytest.raises(InvalidRequestError, match="idempotency_key"):
        idempotency_digest(key, "alpha")
