"""Cancels racing a worker and each other (producer/cancel.py), on a real redis-server: the
state a cancel acts on is the job's state when it acts, never an earlier read of it.

- a job that a worker finished between the cancel's fetch and its act stays finished, its
  result kept and no `job.canceled` event told;
- of many cancels of one waiting job at once, exactly one says `canceled` and one event is told.
"""

from __future__ import annotations

import threading

import pytest
import redis
from rq.job import Job, JobStatus
from rq.registry import CanceledJobRegistry, FinishedJobRegistry

from producer.cancel import CancelOutcome, cancel_job
from producer.tracking import JobTracker
from shared import keys
from shared.job_events import WebhookPolicy
from shared.settings import Settings, load_settings
from shared.tenants import TENANT_META_KEY
from tests.doubles.harness import json_queue

HOOK = "http://127.0.0.1:9/hooks/"
POLICY = WebhookPolicy(allowed=(HOOK,), memory_s=600, allow_private=True)
CANCELERS = 64  # cancels of one job at once
ROUNDS = 8  # jobs canceled so, one after the other


class FinishedAfterFetch(JobTracker):
    """A tracker whose fetch returns the job as it was, then a worker finishes it: the moment
    between a cancel's read and its act, made to happen every time."""

    def fetch(self, job_id: str) -> Job:
        job = super().fetch(job_id)
        worker_side = Job.fetch(job_id, connection=self.connection)
        queue = json_queue(self.connection)
        queue.remove(worker_side)
        worker_side.set_status(JobStatus.FINISHED)
        FinishedJobRegistry(queue.name, connection=self.connection).add(worker_side, -1)
        return job


@pytest.fixture
def settings(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    return load_settings(env_file=None)


def waiting_job(connection: redis.Redis) -> Job:
    request = {"text": "fine", "webhook": {"url": HOOK}}
    meta = {TENANT_META_KEY: "alpha"}
    return json_queue(connection).enqueue(keys.SYNTHESIZE_FUNCTION, request=request, meta=meta)


def told(connection: redis.Redis, job: Job) -> list[str]:
    """The webhook events appended for `job` (their outcome names)."""
    entries = connection.xrange(keys.WEBHOOK_OUTBOX)
    events = [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]
    return [event["event"] for event in events if event["job_id"] == job.id]


def test_a_job_finished_under_a_cancel_stays_finished(redis_url: str, settings: Settings) -> None:
    connection = redis.Redis.from_url(redis_url)
    job = waiting_job(connection)
    tracker = FinishedAfterFetch(connection, settings)
    outcome = cancel_job(connection, tracker, job.id, flag_ttl_s=60, webhooks=POLICY)
    assert (outcome.verdict, outcome.state) == ("already_ended", "finished")
    assert Job.fetch(job.id, connection=connection).get_status() == JobStatus.FINISHED
    assert job.id not in CanceledJobRegistry(job.origin, connection=connection)
    assert told(connection, job) == []  # the worker tells its own end


def cancels_at_once(redis_url: str, settings: Settings, job_id: str) -> list[CancelOutcome]:
    """CANCELERS cancels of one job let go together, each on its own connection (as a front's
    requests are); their outcomes."""
    start = threading.Barrier(CANCELERS)
    outcomes: list[CancelOutcome] = []

    def cancel() -> None:
        own = redis.Redis.from_url(redis_url)
        tracker = JobTracker(own, settings)
        start.wait()
        outcomes.append(cancel_job(own, tracker, job_id, flag_ttl_s=60, webhooks=POLICY))

    threads = [threading.Thread(target=cancel) for _ in range(CANCELERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def test_of_many_cancels_at_once_exactly_one_cancels(redis_url: str, settings: Settings) -> None:
    connection = redis.Redis.from_url(redis_url)
    for _ in range(ROUNDS):
        job = waiting_job(connection)
        verdicts = sorted(
            outcome.verdict for outcome in cancels_at_once(redis_url, settings, job.id)
        )
        assert verdicts == ["already_canceled"] * (CANCELERS - 1) + ["canceled"]
        assert told(connection, job) == ["job.canceled"]
        assert Job.fetch(job.id, connection=connection).get_status() == JobStatus.CANCELED
