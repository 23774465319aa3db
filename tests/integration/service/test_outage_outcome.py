"""A job that finishes while Redis is down: its outcome is written once Redis is back, it is not
run again, and the idle worker beside it logs the outage once and the recovery once."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import redis

from tests.doubles.harness import Cluster, enqueue, named, statuses, wait_for
from workers.tools.local_redis import LocalRedis


def test_a_job_finished_during_an_outage_is_recorded_not_rerun(
    persistent_redis: LocalRedis, tmp_path: Path
) -> None:
    cluster = Cluster(redis_url=persistent_redis.url, root=tmp_path)
    connection = redis.Redis.from_url(persistent_redis.url)
    try:
        pool = cluster.start("pool", "-n", "2", log_name="pool.log")
        wait_for(lambda: len(named(cluster.events("pool.log"), "slot_ready")) == 2, 60, "ready")
        job = enqueue(connection, "sleep:3 finishes while Redis is down")
        wait_for(lambda: statuses(connection, [job]) == ["started"], 30, "the job to start")
        persistent_redis.stop()
        wait_for(
            lambda: named(cluster.events("pool.log"), "job_outcome_unrecorded"), 30, "unrecorded"
        )
        time.sleep(3)  # longer than the heartbeat TTL (2 s): the key is gone when Redis is back
        persistent_redis.start()
        wait_for(lambda: statuses(connection, [job]) == ["finished"], 60, "the job recorded")
        time.sleep(3)  # a reaper would have taken it by now
        job.refresh()
        assert job.get_status() == "finished"
        assert job.meta.get("cosyq_attempt") == 1  # ran once
        assert job.latest_result() is not None
        pool.send_signal(signal.SIGTERM)
        assert pool.wait(timeout=30) == 0
    finally:
        cluster.stop_all()
        connection.close()
    events = cluster.events("pool.log")
    assert named(events, "job_released") == []  # nobody reran it, as worker_died or otherwise
    assert len(named(events, "job_outcome_unrecorded")) == 1
    assert len(named(events, "job_outcome_recorded")) == 1
    assert len(named(events, "synthesis_finished")) == 1
    errors = Counter(e.get("pid") for e in named(events, "housekeeping_redis_error"))
    recovered = Counter(e.get("pid") for e in named(events, "housekeeping_redis_recovered"))
    assert len(errors) >= 2 and all(n == 1 for n in errors.values())  # each worker, once
    assert recovered == errors  # and the recovery once, never alternating with the error


def test_an_unavoidable_rerun_is_labelled_outcome_unrecorded(redis_url: str) -> None:
    from rq import Retry  # noqa: PLC0415
    from rq.job import JobStatus  # noqa: PLC0415
    from rq.registry import StartedJobRegistry  # noqa: PLC0415

    from tests.doubles.harness import json_queue  # noqa: PLC0415
    from workers.service.outcomes import release_unrecorded  # noqa: PLC0415

    connection = redis.Redis.from_url(redis_url)
    queue = json_queue(connection)
    job = enqueue(connection, "popped, then Redis went away", retry=Retry(max=1))
    connection.lrem(queue.key, 1, job.id)  # taken by a worker ...
    job.set_status(JobStatus.STARTED)
    registry = StartedJobRegistry(queue=queue)
    connection.zadd(registry.key, {f"{job.id}:execution-1": time.time() + 600})
    release_unrecorded(connection, queue, job, "host.1.abcd")  # ... which lost Redis meanwhile
    job.refresh()
    assert job.get_status() == "queued" and connection.lpos(queue.key, job.id) == 0
    assert job.meta["cosyq_last_error"] == {
        "kind": "outcome_unrecorded",
        "message": "worker host.1.abcd lost Redis before it could record this attempt",
    }
    assert connection.zcard(registry.key) == 0
    connection.close()


def test_a_warm_stop_waits_for_redis_only_so_long_and_the_job_is_given_back(
    persistent_redis: LocalRedis, tmp_path: Path
) -> None:
    """Issue 45 item 13: SIGTERM to a pool whose Redis went away mid-job. The worker may wait
    for Redis to record the job, but only COSYQ_STOP_REDIS_WAIT_S; then it exits (status 3)
    naming the job, and once Redis is back the next pool's reaper gives the job back and it
    finishes: nothing is lost, nobody waits for a second signal."""
    cluster = Cluster(
        redis_url=persistent_redis.url, root=tmp_path, overrides={"COSYQ_STOP_REDIS_WAIT_S": "2"}
    )
    connection = redis.Redis.from_url(persistent_redis.url)
    try:
        pool = cluster.start("pool", "-n", "1", log_name="pool.log")
        wait_for(lambda: named(cluster.events("pool.log"), "slot_ready"), 60, "the worker ready")
        # 4 s on its first attempt (running when Redis goes away), none when given back
        job = enqueue(
            connection, f"once:{tmp_path / 'ran'} sleep:4 is running when Redis goes away"
        )
        wait_for(lambda: statuses(connection, [job]) == ["started"], 30, "the job to start")
        persistent_redis.stop()
        pool.send_signal(signal.SIGTERM)
        assert pool.wait(timeout=30) == 0  # before: the worker waited out the outage for good
        events = cluster.events("pool.log")
        [gave_up] = named(events, "worker_stop_gave_up_on_redis")
        assert gave_up["jobs"] == [job.id] and gave_up["waited_s"] == 2
        assert [e["how"] for e in named(events, "slot_exited")] == ["exit code 3"]
        persistent_redis.start()
        again = cluster.start("pool", "-n", "1", log_name="pool-again.log")
        wait_for(lambda: statuses(connection, [job]) == ["finished"], 60, "the job given back")
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=30) == 0
    finally:
        cluster.stop_all()
        connection.close()
    job.refresh()
    assert job.meta.get("cosyq_attempt") == 2  # the first attempt's outcome never reached Redis
    assert len(named(cluster.events("pool-again.log"), "synthesis_finished")) == 1
