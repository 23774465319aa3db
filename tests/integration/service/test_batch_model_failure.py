"""A batching worker whose model thread fails retires at once, and loses no job.

The worker loads `tests.doubles.engines:crashing_batch`: the real batch session over a scripted
decoder whose first step fails for good, as when the device is lost (tests/doubles/crashing.py).
With a batch of two and five jobs, the one or two on the model fail with the session's error
(`internal`, never retried); one the window had admitted and not yet handed to the model is
retried (`transient`); the others never leave their queue. The worker takes no more jobs and
exits 0 by itself with reason `model_failed`, and a fresh worker, its model sound, finishes
every job that was not failed. Before, the next window's `submit` raised out of the worker: it
died on a traceback with that job left started.

Whatever the timing, each job ends failed (the crash's) or queued, never started; no clock is
read or slept on.
"""

from __future__ import annotations

import pytest
import redis
from rq.registry import StartedJobRegistry

from tests.doubles.harness import Cluster, enqueue, named, statuses

CRASHING = {"COSYQ_ENGINE": "tests.doubles.engines:crashing_batch", "TESTENGINE_STEP_S": "0.01"}
DEVICE_LOST = {"kind": "internal", "message": "DeviceLost: the device is gone"}


@pytest.fixture
def worker_batch_size() -> int:
    """A window of two: the other jobs stay in their queue while it runs."""
    return 2


def test_a_worker_whose_model_thread_failed_retires_at_once_and_loses_no_job(
    cluster: Cluster, connection: redis.Redis
) -> None:
    jobs = [enqueue(connection, f"seconds:1 sentence {i}", seed=i) for i in range(5)]
    worker = cluster.start("run", log_name="w1.log", **CRASHING)
    assert worker.wait(timeout=60) == 0  # it left by itself, on no traceback
    events = cluster.events("w1.log")
    assert [e["reason"] for e in named(events, "worker_retiring")] == ["model_failed"]
    assert len(named(events, "batch_model_failed")) == 1
    found = statuses(connection, jobs)
    assert set(found) <= {"failed", "queued"}, found
    assert len(StartedJobRegistry("cosyq-default", connection=connection)) == 0
    failed = [job for job, status in zip(jobs, found, strict=True) if status == "failed"]
    assert 1 <= len(failed) <= 2  # the rows on the failing step, none past the window
    for job in failed:
        assert job.meta["cosyq_error"] == DEVICE_LOST
    for line in named(events, "job_failed"):  # a job it never ran is retried
        assert (line["kind"], line["will_retry"]) in {("internal", False), ("transient", True)}
    fresh = cluster.start("run", "--burst", log_name="w2.log")  # tests.doubles.engines:fast
    assert fresh.wait(timeout=60) == 0
    expected = ["failed" if job in failed else "finished" for job in jobs]
    assert statuses(connection, jobs) == expected
