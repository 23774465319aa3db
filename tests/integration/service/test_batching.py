"""COSYQ_BATCH_SIZE > 1: jobs share the model, each kept whole in RQ's books.

Workers here load `tests.doubles.engines:batching`, whose session batches across requests in
steps (like the engine's decode loop) and reports how many requests shared a step.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import pytest
import redis
from rq.job import Job
from rq.registry import FailedJobRegistry, FinishedJobRegistry, StartedJobRegistry

from tests.doubles.harness import Cluster, enqueue, named, statuses, wait_for

BATCHING = {"COSYQ_ENGINE": "tests.doubles.engines:batching", "COSYQ_BATCH_SIZE": "8"}
DEADLINE_S = 30  # the bound for a killed worker's jobs


@pytest.fixture
def worker_batch_size() -> int:
    """These tests set COSYQ_BATCH_SIZE themselves: run each once."""
    return 8


def result(job: Job) -> dict:
    found = job.latest_result()
    assert found is not None and isinstance(found.return_value, dict)
    return found.return_value


def seeded_jobs(connection: redis.Redis, n: int, queue: str = "cosyq-default") -> list[Job]:
    return [
        enqueue(connection, f"seconds:2 sentence number {i}", seed=100 + i, queue=queue)
        for i in range(n)
    ]


def test_24_seeded_jobs_batch_and_match_the_same_jobs_run_one_at_a_time(
    cluster: Cluster, connection: redis.Redis
) -> None:
    batched = seeded_jobs(connection, 24)
    worker = cluster.start("run", "--burst", log_name="b8.log", **BATCHING)
    assert worker.wait(timeout=120) == 0
    assert statuses(connection, batched) == ["finished"] * 24
    sizes = [result(job)["batch_size"] for job in batched]
    assert sum(size >= 4 for size in sizes) > 12, sizes
    assert max(sizes) <= 8
    events = cluster.events("b8.log")
    finished_lines = named(events, "synthesis_finished")
    assert sorted(e["job_id"] for e in finished_lines) == sorted(j.id for j in batched)
    assert all(e["batch_size"] >= 1 for e in finished_lines)
    windows = named(events, "batch_window_closed")
    assert sum(w["jobs"] for w in windows) == 24 and 0 <= windows[0]["model_idle_share"] <= 1
    for job in batched:
        job.refresh()
        assert job.meta["cosyq_attempt"] == 1
    finished = FinishedJobRegistry("cosyq-default", connection=connection)
    assert sorted(finished.get_job_ids()) == sorted(job.id for job in batched)

    alone = seeded_jobs(connection, 24)
    # alone, each job decodes its 12 steps one after another: the samples do not depend on
    # the step's length (tests/doubles/stepped.py), so these take 2 ms, not the default 20
    one_at_a_time = {**BATCHING, "COSYQ_BATCH_SIZE": "1", "TESTENGINE_STEP_S": "0.002"}
    worker = cluster.start("run", "--burst", log_name="b1.log", **one_at_a_time)
    assert worker.wait(timeout=120) == 0
    assert statuses(connection, alone) == ["finished"] * 24
    for together, single in zip(batched, alone, strict=True):
        assert result(single)["batch_size"] == 1
        assert result(together)["sha256"] == result(single)["sha256"]
        assert result(together)["duration_s"] == result(single)["duration_s"]


def test_bad_jobs_in_a_batch_fail_alone(cluster: Cluster, connection: redis.Redis) -> None:
    # 1 s on the model each (8 s of audio): long enough to overlap however slow the machine
    good = [enqueue(connection, f"seconds:8 good {i}", seed=i) for i in range(4)]
    invalid = enqueue(connection, "seconds:1 invalid")
    unknown_voice = enqueue(connection, "seconds:1 hello", voice="nobody")
    boom = enqueue(connection, "seconds:1 boom")
    bad_speed = enqueue(connection, "seconds:1 fast", speed=50)
    good += [enqueue(connection, f"seconds:8 more good {i}", seed=i) for i in range(3)]
    worker = cluster.start("run", "--burst", log_name="w.log", **BATCHING)
    assert worker.wait(timeout=60) == 0
    assert statuses(connection, good) == ["finished"] * len(good)
    assert max(result(job)["batch_size"] for job in good) >= 4
    for job, kind in (
        (invalid, "invalid_request"),
        (unknown_voice, "invalid_request"),
        (boom, "internal"),
        (bad_speed, "invalid_request"),
    ):
        job.refresh()
        assert job.get_status() == "failed"
        assert job.meta["cosyq_error"]["kind"] == kind
    failed = FailedJobRegistry("cosyq-default", connection=connection).get_job_ids()
    assert sorted(failed) == sorted(j.id for j in (invalid, unknown_voice, boom, bad_speed))


def test_sigkill_mid_batch_loses_no_job(cluster: Cluster, connection: redis.Redis) -> None:
    jobs = [enqueue(connection, f"seconds:20 long {i}", seed=i) for i in range(6)]
    first = cluster.start("run", log_name="first.log", **BATCHING, TESTENGINE_STEP_S="0.1")
    wait_for(lambda: statuses(connection, jobs) == ["started"] * 6, 30, "6 jobs in flight")
    assert len(StartedJobRegistry("cosyq-default", connection=connection)) == 6
    second = cluster.start("run", log_name="second.log", **BATCHING, TESTENGINE_STEP_S="0.001")
    wait_for(lambda: named(cluster.events("second.log"), "worker_ready"), 30, "second worker")
    first.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: statuses(connection, jobs) == ["finished"] * 6, DEADLINE_S, "all 6 jobs")
    assert time.monotonic() - killed_at < DEADLINE_S
    assert {result(job)["worker_pid"] for job in jobs} == {second.pid}
    assert {result(job)["attempt"] for job in jobs} == {2}
    released = named(cluster.events("second.log"), "job_released")
    assert sorted(e["job_id"] for e in released) == sorted(job.id for job in jobs)


def test_jobs_queued_while_a_batch_decodes_join_it(
    cluster: Cluster, connection: redis.Redis
) -> None:
    worker = cluster.start("run", log_name="w.log", **BATCHING, TESTENGINE_STEP_S="0.05")
    wait_for(lambda: named(cluster.events("w.log"), "worker_ready"), 30, "ready")
    first = enqueue(connection, "seconds:16 first", seed=1)  # 5 s on the model: time to join
    wait_for(lambda: first.get_status() == "started", 30, "the first job to start")
    time.sleep(0.3)  # the first job is decoding
    late = [enqueue(connection, f"seconds:2 late {i}", seed=i) for i in range(3)]
    urgent = enqueue(connection, "seconds:2 urgent", queue="cosyq-high")
    wait_for(lambda: statuses(connection, [first, *late, urgent]) == ["finished"] * 5, 30, "all")
    assert result(first)["batch_size"] >= 4
    ended = {job.id: job.ended_at for job in (first, *late)}
    started = {job.id: job.started_at for job in late}
    first_end = ended[first.id]
    assert all(start is not None and start < first_end for start in started.values())
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


def test_warm_stop_finishes_the_batch_and_leaves_the_rest_queued(
    cluster: Cluster, connection: redis.Redis
) -> None:
    jobs = [enqueue(connection, f"seconds:4 stop {i}", seed=i) for i in range(12)]
    worker = cluster.start("run", log_name="w.log", **BATCHING, TESTENGINE_STEP_S="0.05")
    wait_for(lambda: Counter(statuses(connection, jobs))["started"] == 8, 30, "a full batch")
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
    counts = Counter(statuses(connection, jobs))
    assert counts == {"finished": 8, "queued": 4}, counts
    assert connection.llen("rq:queue:cosyq-default") == 4
    assert len(StartedJobRegistry("cosyq-default", connection=connection)) == 0


def test_a_job_past_its_timeout_in_a_batch_fails_alone_and_the_worker_retires(
    cluster: Cluster, connection: redis.Redis, tmp_path: Path
) -> None:
    quick = [enqueue(connection, f"seconds:1 quick {i}", seed=i) for i in range(3)]
    slow = enqueue(connection, "seconds:40 too slow")
    worker = cluster.start(
        "run",
        log_name="w.log",
        **BATCHING,
        TESTENGINE_STEP_S="0.1",
        COSYQ_JOB_TIMEOUT_S="2",
        COSYQ_MAX_RETRIES="0",
    )
    assert worker.wait(timeout=60) == 0
    assert statuses(connection, quick) == ["finished"] * 3
    slow.refresh()
    assert slow.get_status() == "failed"
    assert slow.meta["cosyq_error"]["message"] == "job timed out after 2 s"
    events = cluster.events("w.log")
    assert [e["reason"] for e in named(events, "worker_retiring")] == ["job_timeout"]


def test_second_signal_gives_every_held_job_back_at_once(
    cluster: Cluster, connection: redis.Redis
) -> None:
    jobs = [enqueue(connection, f"seconds:20 held {i}", seed=i) for i in range(10)]
    worker = cluster.start("run", log_name="w.log", **BATCHING, TESTENGINE_STEP_S="0.1")
    wait_for(lambda: Counter(statuses(connection, jobs))["started"] == 8, 30, "a full batch")
    stats = connection.keys("cosyq:worker-stats:*")
    assert len(connection.hget(stats[0], "current_job").decode().split(",")) == 8
    worker.send_signal(signal.SIGTERM)
    time.sleep(1.2)  # a second signal within 1 s is treated as the same Ctrl+C
    sent = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 1
    assert time.monotonic() - sent < 5
    assert statuses(connection, jobs) == ["queued"] * 10
    assert connection.llen("rq:queue:cosyq-default") == 10
    assert len(StartedJobRegistry("cosyq-default", connection=connection)) == 0
    given_back = 0
    for job in jobs:
        job.refresh()
        if "cosyq_last_error" in job.meta:
            assert job.meta["cosyq_last_error"]["kind"] == "worker_died"
            given_back += 1
    assert given_back == 8
    assert connection.smembers("rq:workers") == set()
