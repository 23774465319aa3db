"""Cancels racing a worker and each other (producer/cancel.py), on a real redis-server: the
state a cancel acts on is the job's state when it acts, never an earlier read of it.

- a job that a worker finished between the cancel's fetch and its act stays finished, its
  result kept and no `job.canceled` event told;
- of many cancels of one waiting job at once, exactly one says `canceled` and one event is told;
- a worker that pops the job, sees the flag and cancels it itself, between a cancel's flag and
  its transaction, cancels it for that cancel: it says `canceled` (not `already_canceled`);
- the same against a real pool of workers popping the jobs the cancels race for: of each job's
  cancels exactly one says `canceled` when the job never ran, none when it ran; a job a cancel
  was told `canceled` for is never `started` after (its status history, read by MONITOR) and
  stores nothing.
"""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.registry import CanceledJobRegistry, FinishedJobRegistry
from rq.serializers import JSONSerializer

from producer.cancel import CancelOutcome, cancel_job
from producer.tracking import JobTracker
from shared import keys
from shared.job_events import WebhookPolicy
from shared.settings import Settings, load_settings
from shared.tenants import DEFAULT_TENANT, TENANT_META_KEY
from tests.doubles.harness import json_queue, named, pool_of_two, statuses, wait_for
from tests.doubles.status_history import StatusHistory, started_after_canceled
from workers.service import cancels

HOOK = "http://127.0.0.1:9/hooks/"
POLICY = WebhookPolicy(allowed=(HOOK,), memory_s=600, allow_private=True)
CANCELERS = 64  # cancels of one job at once
ROUNDS = 8  # jobs canceled so, one after the other
POOL_ROUNDS = 80  # jobs a pool pops while POOL_CANCELERS cancels of each race it
POOL_CANCELERS = 8
ENDED = ("finished", "failed", "canceled")


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


class WorkerCancelsAfterFlag(redis.Redis):
    """A cancel's connection: once the cancel has set its flag, a worker pops the job, sees the
    flag and records it canceled (workers/service/cancels.py, the worker's own calls), before the
    cancel's transaction: the moment the pool test below hits by chance, made every time."""

    def set(self, name: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        done = super().set(name, value, *args, **kwargs)
        if isinstance(name, str) and name.startswith(keys.CANCEL_PREFIX):
            worker = redis.Redis(connection_pool=self.connection_pool)
            queues = [json_queue(worker)]
            popped = Queue.dequeue_any(queues, None, connection=worker, serializer=JSONSerializer)
            assert popped is not None
            job, queue = popped
            assert cancels.canceled_before_start(worker, job)
            cancels.record_canceled(worker, job, queue, webhooks=POLICY)
        return done


@pytest.fixture
def settings(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    return load_settings(env_file=None)


def waiting_job(connection: redis.Redis, tenant: str = "alpha") -> Job:
    request = {"text": "fine", "webhook": {"url": HOOK}}
    meta = {TENANT_META_KEY: tenant}
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


def cancels_at_once(
    redis_url: str, settings: Settings, job_id: str, cancelers: int = CANCELERS
) -> list[CancelOutcome]:
    """`cancelers` cancels of one job let go together, each on its own connection (as a front's
    requests are); their outcomes."""
    start = threading.Barrier(cancelers)
    outcomes: list[CancelOutcome] = []

    def cancel() -> None:
        own = redis.Redis.from_url(redis_url)
        tracker = JobTracker(own, settings)
        start.wait()
        outcomes.append(cancel_job(own, tracker, job_id, flag_ttl_s=60, webhooks=POLICY))

    threads = [threading.Thread(target=cancel) for _ in range(cancelers)]
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


def test_a_worker_canceling_between_flag_and_transaction_cancels_for_the_cancel(
    redis_url: str, settings: Settings
) -> None:
    connection = redis.Redis.from_url(redis_url)
    job = waiting_job(connection)
    racing = WorkerCancelsAfterFlag.from_url(redis_url)
    outcome = cancel_job(
        racing, JobTracker(racing, settings), job.id, flag_ttl_s=60, webhooks=POLICY
    )
    assert (outcome.verdict, outcome.state) == ("canceled", "queued")
    assert Job.fetch(job.id, connection=connection).get_status() == JobStatus.CANCELED
    again = cancel_job(connection, JobTracker(connection, settings), job.id, flag_ttl_s=60)
    assert again.verdict == "already_canceled"
    assert told(connection, job) == ["job.canceled"]


def ended(connection: redis.Redis, job: Job) -> bool:
    return statuses(connection, [job])[0] in ENDED


@pytest.mark.timeout(300)
def test_cancels_racing_a_pool_say_canceled_once_for_a_job_that_never_ran(
    redis_url: str, settings: Settings, tmp_path: Path
) -> None:
    """Each job is popped by an idle worker the instant it is queued, while its cancels are let
    go: some are canceled by a cancel's transaction, some by the worker that popped them and
    saw a flag, some run. Whatever the timing, judged once the pool has stopped (a job a worker
    popped an instant before a cancel's transaction canceled it is started yet, and stopped at
    its first step): a job canceled with no cancel told `stopping` has exactly one `canceled`
    answer, a finished job none, and each job tells its webhook exactly one event. A job
    that a cancel was told `canceled` for is never `started` after its `canceled` and stores
    nothing (the worker's start is claimed against the cancel: workers/service/cancels.py)."""
    overrides = {"COSYQ_WEBHOOK_ALLOWED_URLS": HOOK, "COSYQ_WEBHOOK_ALLOW_PRIVATE": "true"}
    connection = redis.Redis.from_url(redis_url)
    rounds: list[tuple[Job, Counter[str]]] = []
    history = StatusHistory(redis_url)
    with pool_of_two(redis_url, tmp_path, overrides) as cluster:
        warm = waiting_job(connection, DEFAULT_TENANT)  # both workers up: the jobs meet idle ones
        wait_for(lambda: statuses(connection, [warm]) == ["finished"], 120, "the first job")
        for _ in range(POOL_ROUNDS):
            job = waiting_job(connection, DEFAULT_TENANT)
            outcomes = cancels_at_once(redis_url, settings, job.id, POOL_CANCELERS)
            assert len(outcomes) == POOL_CANCELERS  # none raised
            rounds.append((job, Counter(outcome.verdict for outcome in outcomes)))
            wait_for(lambda job=job: ended(connection, job), 60, "its end")
    history.stop()
    by_worker = {e["job_id"] for e in named(cluster.events("pool.log"), "job_canceled")}
    tally: Counter[str] = Counter()
    for job, verdicts in rounds:
        [status] = statuses(connection, [job])
        assert len(told(connection, job)) == 1, told(connection, job)
        if verdicts["canceled"]:  # told it will not run: it never starts after, stores nothing
            assert not started_after_canceled(history.statuses(job.id)), history.statuses(job.id)
            assert list(tmp_path.rglob(f"{job.id}*")) == [], status
        if status != "canceled":  # it ran: no cancel may say it will not
            assert verdicts["canceled"] == 0, (status, verdicts)
        elif verdicts["stopping"]:  # it ran and was stopped (or a worker started it, above)
            assert verdicts["canceled"] <= 1, (status, verdicts)
        else:  # it never ran: whoever did the work, one cancel is told it did
            assert verdicts["canceled"] == 1, (status, verdicts)
        told_canceled = verdicts["canceled"]
        tally[f"{status}, {told_canceled} canceled, stopping: {verdicts['stopping'] > 0}"] += 1
    print(f"{POOL_ROUNDS} jobs: {dict(tally)}; a worker recorded {len(by_worker)} canceled")
