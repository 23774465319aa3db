"""The orphan sweep: a job `queued` in no list goes back to the head of its queue, once it has
been seen nowhere for the bound, and a job `started` in no registry and with no heartbeat goes
back to the reaper; everything else is left alone, and the cost stays bounded."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
import redis
from rq import Retry
from rq.job import Job

from producer import CosyqClient
from shared import keys
from shared.settings import load_settings
from tests.doubles.harness import Cluster, enqueue, json_queue, named, wait_for
from workers.service.orphans import OrphanSweep
from workers.service.reaper import Reaper

BOUND_S = 30.0
DEFAULT_KEY = "rq:queue:cosyq-default"


def sweep_on(connection: redis.Redis, batch: int = 100) -> OrphanSweep:
    return OrphanSweep(connection, orphan_after_s=BOUND_S, batch=batch, holder="test")


def submitted(connection: redis.Redis, job: Job, at: float) -> Job:
    """Record the job as the producer does (its id and submit time in the index)."""
    connection.zadd(keys.SUBMITTED_JOBS, {job.id: at})
    return job


def lost(connection: redis.Redis, text: str, at: float) -> Job:
    """A job whose hash says queued but whose id is in no list (a pop reply that vanished)."""
    job = submitted(connection, enqueue(connection, text), at)
    connection.lrem(DEFAULT_KEY, 0, job.id)
    return job


def queued_ids(connection: redis.Redis) -> list[str]:
    return [raw.decode() for raw in connection.lrange(DEFAULT_KEY, 0, -1)]


def test_a_job_seen_nowhere_for_the_bound_goes_back_to_the_head(connection: redis.Redis) -> None:
    t0 = 1_000_000.0
    waiting = submitted(connection, enqueue(connection, "waiting"), t0)
    orphan = lost(connection, "orphan", t0)
    sweep = sweep_on(connection)
    assert sweep.sweep(now=t0 + BOUND_S - 1).checked == 0  # too young to look at
    first = sweep.sweep(now=t0 + BOUND_S)
    assert (first.checked, first.suspects, first.requeued) == (2, 1, ())
    assert queued_ids(connection) == [waiting.id]  # a first sighting only marks a suspect
    second = sweep.sweep(now=t0 + 2 * BOUND_S)
    assert second.requeued == (orphan.id,)
    assert queued_ids(connection) == [orphan.id, waiting.id]
    assert orphan.get_status() == "queued"
    assert connection.zcard(keys.ORPHAN_SUSPECTS) == 0
    assert sweep.sweep(now=t0 + 4 * BOUND_S).requeued == ()  # found in its queue: left alone


def test_a_job_that_reappears_is_no_longer_a_suspect(connection: redis.Redis) -> None:
    t0 = 1_000_000.0
    job = lost(connection, "popped, then pushed back", t0)
    sweep = sweep_on(connection)
    assert sweep.sweep(now=t0 + BOUND_S).suspects == 1
    connection.lpush(DEFAULT_KEY, job.id)  # its worker gave it back meanwhile
    assert sweep.sweep(now=t0 + 2 * BOUND_S).requeued == ()
    assert connection.zcard(keys.ORPHAN_SUSPECTS) == 0
    assert queued_ids(connection) == [job.id]  # once, not twice


def test_finished_and_expired_jobs_leave_the_index_running_ones_stay(
    connection: redis.Redis,
) -> None:
    t0 = 1_000_000.0
    done = lost(connection, "done", t0)
    done.set_status("finished")
    gone = lost(connection, "expired", t0)
    connection.delete(gone.key)
    running = lost(connection, "between registration and start", t0)
    queue = json_queue(connection)
    connection.zadd(queue.started_job_registry.key, {f"{running.id}:exec1": t0 + 600})
    result = sweep_on(connection).sweep(now=t0 + 3 * BOUND_S)
    assert (result.checked, result.forgotten, result.suspects) == (3, 2, 0)
    assert [raw.decode() for raw in connection.zrange(keys.SUBMITTED_JOBS, 0, -1)] == [running.id]
    assert connection.zscore(keys.SUBMITTED_JOBS, running.id) == t0 + 3 * BOUND_S  # rotated


def started_nowhere(connection: redis.Redis, text: str, at: float) -> Job:
    """A job that says started but is in no list or registry: a reaper removed its dead
    worker's started entry (the ZREM that makes it the job's owner) and lost Redis before it
    requeued or failed the job."""
    job = lost(connection, text, at)
    job.set_status("started")
    return job


def test_a_started_job_its_reaper_lost_goes_back_to_the_reaper(connection: redis.Redis) -> None:
    """Nothing else would ever run or fail such a job (a document waiting on it would wait
    forever): seen so a bound apart, it goes back to its started registry, where the reaper
    retries it. A started job whose worker still beats is left alone."""
    t0 = 1_000_000.0
    job = submitted(connection, enqueue(connection, "orphaned", retry=Retry(max=1)), t0)
    connection.lrem(DEFAULT_KEY, 0, job.id)
    job.set_status("started")
    running = started_nowhere(connection, "its worker lives", t0)
    connection.set(keys.job_heartbeat_key(running.id), "live-worker")
    sweep = sweep_on(connection)
    first = sweep.sweep(now=t0 + BOUND_S)
    assert (first.suspects, first.released) == (1, ())
    assert sweep.sweep(now=t0 + 2 * BOUND_S).released == (job.id,)
    reaped = Reaper(connection, ["cosyq-default"], heartbeat_ttl_s=2).reap()
    assert [(r.job_id, r.outcome) for r in reaped] == [(job.id, "retried")]
    assert queued_ids(connection) == [job.id] and job.get_status() == "queued"
    assert running.get_status() == "started"  # its worker's, untouched
    assert connection.zcard(keys.ORPHAN_SUSPECTS) == 0


def test_a_started_job_its_reaper_lost_with_no_retry_left_fails(connection: redis.Redis) -> None:
    t0 = 1_000_000.0
    job = started_nowhere(connection, "orphaned, no retries", t0)
    sweep = sweep_on(connection)
    sweep.sweep(now=t0 + BOUND_S)
    assert sweep.sweep(now=t0 + 2 * BOUND_S).released == (job.id,)
    reaped = Reaper(connection, ["cosyq-default"], heartbeat_ttl_s=2).reap()
    assert [(r.job_id, r.outcome) for r in reaped] == [(job.id, "failed")]
    assert job.get_status() == "failed"


def test_each_sweep_checks_at_most_its_batch_oldest_first(connection: redis.Redis) -> None:
    t0 = 1_000_000.0
    jobs = [submitted(connection, enqueue(connection, f"job {i}"), t0 + i) for i in range(5)]
    sweep = sweep_on(connection, batch=2)
    now = t0 + BOUND_S + 10
    assert sweep.sweep(now=now).checked == 2
    rotated = connection.zrangebyscore(keys.SUBMITTED_JOBS, now, now)
    assert sorted(raw.decode() for raw in rotated) == sorted(job.id for job in jobs[:2])
    assert sweep.sweep(now=now).checked == 2  # the next two, not the same ones again


def test_one_sweeper_per_tick(connection: redis.Redis) -> None:
    first = OrphanSweep(connection, orphan_after_s=BOUND_S, batch=10, holder="a")
    second = OrphanSweep(connection, orphan_after_s=BOUND_S, batch=10, holder="b")
    assert first.tick(interval_s=5) is not None
    assert second.tick(interval_s=5) is None


def test_a_submitted_job_lost_from_its_queue_is_run_within_the_bound(
    cluster: Cluster,
    connection: redis.Redis,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_STORAGE_URL", (tmp_path / "out").as_uri())
    with CosyqClient(load_settings(env_file=None)) as client:
        job_id = client.submit({"text": "lost between pop and start"})
    assert connection.zscore(keys.SUBMITTED_JOBS, job_id) is not None  # the producer's record
    connection.lrem(DEFAULT_KEY, 0, job_id)
    bound_s = 1.0
    cluster.start("run", log_name="w.log", COSYQ_ORPHAN_AFTER_S=str(bound_s))
    job = Job.fetch(job_id, connection=connection)
    wait_for(lambda: job.get_status() == "finished", 30, "the orphan to be found and run")
    events = cluster.events("w.log")
    (requeued,) = named(events, "job_orphan_requeued")
    assert requeued["job_id"] == job_id and requeued["orphaned_for_s"] >= bound_s
    # Seen nowhere at the worker's first housekeeping tick, back one bound (+ a tick) later:
    # seconds, where RQ alone would never run it.
    started = datetime.fromisoformat(named(events, "worker_loading")[0]["timestamp"])
    back = datetime.fromisoformat(requeued["timestamp"])
    assert (back - started).total_seconds() < 2 * bound_s + 5
