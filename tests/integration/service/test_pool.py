"""`cosyq-worker pool`: restarts, one load at a time, crash-loop backoff, warm shutdown."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import Counter
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.doubles.harness import Cluster, enqueue, named, statuses, wait_for
from workers.tools.local_redis import LocalRedis

# Both ways the pool starts a worker (COSYQ_POOL_START) keep every promise here, one per batch
# size: batch1's workers exec, batch8's fork from the template (Linux; macOS execs), which
# spares each of their starts and restarts the worker's imports (about 0.5 s of CPU each).
POOL_START = {1: "exec", 8: "template"}


@pytest.fixture(autouse=True)
def pool_start(cluster: Cluster, worker_batch_size: int) -> str:
    start = POOL_START[worker_batch_size]
    cluster.overrides["COSYQ_POOL_START"] = start
    return start


def loading_intervals(events: list[dict[str, Any]]) -> list[tuple[datetime, datetime, str]]:
    """(loading start, ready, worker) for every worker process in the log."""
    started = {e["worker"]: e["timestamp"] for e in named(events, "worker_loading")}
    return sorted(
        (
            datetime.fromisoformat(started[e["worker"]]),
            datetime.fromisoformat(e["timestamp"]),
            e["worker"],
        )
        for e in named(events, "worker_ready")
    )


def test_twelve_jobs_on_two_recycling_slots_all_finish_loading_one_at_a_time(
    cluster: Cluster, connection: redis.Redis
) -> None:
    jobs = [enqueue(connection, f"sleep:0.5 sentence {i}") for i in range(12)]
    pool = cluster.start(
        "pool",
        "-n",
        "2",
        log_name="pool.log",
        COSYQ_MAX_JOBS="3",
        COSYQ_ENGINE="tests.doubles.engines:slow_load",
        TESTENGINE_LOAD_S="0.5",
    )
    wait_for(lambda: statuses(connection, jobs) == ["finished"] * 12, 100, "all 12 jobs")
    # On a busy machine a slot may load slower than the other does 12 jobs: the recycling
    # grant (and the replacement's load) then comes after the last job, not before it.
    wait_for(lambda: len(loading_intervals(cluster.events("pool.log"))) >= 3, 100, "a restart")
    pool.send_signal(signal.SIGTERM)
    assert pool.wait(timeout=30) == 0
    events = cluster.events("pool.log")
    # Recycling under the pool is granted one slot at a time: a worker past its budget keeps
    # working until every other slot is ready, so restarts are at least one per slot.
    stop = named(events, "pool_stopping")[0]["timestamp"]
    recycled = [
        e
        for e in named(events, "slot_exited")
        if e["reason"] == "max_jobs" and e["timestamp"] < stop
    ]
    assert recycled  # restarts are logged (how many depends on load times vs job times)
    restarted = [
        e for e in named(events, "slot_started") if e["timestamp"] > recycled[0]["timestamp"]
    ]
    assert restarted[0]["slot"] == recycled[0]["slot"]
    granted = [e for e in named(events, "slot_retire_granted") if e["timestamp"] < stop]
    for exited in recycled:  # every recycling exit was granted first, for that slot
        assert any(
            g["slot"] == exited["slot"] and g["timestamp"] <= exited["timestamp"] for g in granted
        )
    assert len(granted) - len(recycled) <= 1  # a grant just before the stop may exit after it
    # The grant is a message on the control channel, read between jobs: no signal before the stop.
    assert len(named(events, "worker_retire_granted")) >= len(recycled)
    assert [e for e in named(events, "worker_stop_requested") if e["timestamp"] < stop] == []
    intervals = loading_intervals(events)
    assert len(intervals) >= 3  # two initial loads and at least one replacement
    for (_, ready, first), (start, _, second) in pairwise(intervals):
        assert ready <= start, f"{first} and {second} were loading at the same time"
    jobs_per_pid = Counter(job.latest_result().return_value["worker_pid"] for job in jobs)
    retired_pids = {e["pid"] for e in recycled}
    assert all(jobs_per_pid[pid] >= 3 for pid in retired_pids)
    assert named(events, "pool_stopped")


def test_sigterm_to_the_pool_is_a_warm_shutdown_of_every_slot(
    cluster: Cluster, connection: redis.Redis
) -> None:
    pool = cluster.start("pool", "-n", "2", log_name="pool.log")
    wait_for(lambda: len(named(cluster.events("pool.log"), "slot_ready")) == 2, 60, "2 slots")
    jobs = [enqueue(connection, "sleep:2 in flight") for _ in range(2)]
    wait_for(lambda: statuses(connection, jobs) == ["started"] * 2, 30, "both jobs to start")
    pool.send_signal(signal.SIGTERM)
    assert pool.wait(timeout=30) == 0
    assert statuses(connection, jobs) == ["finished", "finished"]
    events = cluster.events("pool.log")
    assert len(named(events, "worker_stop_requested")) == 2
    assert [e["reason"] for e in named(events, "slot_exited")] == ["stop", "stop"]
    assert connection.smembers("rq:workers") == set()


def test_crash_loop_backs_off_exponentially_with_the_reason_logged(cluster: Cluster) -> None:
    pool = cluster.start(
        "pool",
        "-n",
        "1",
        "--backoff-initial",
        "0.2",
        "--backoff-max",
        "0.8",
        log_name="pool.log",
        COSYQ_ENGINE="tests.doubles.engines:failing",
    )
    wait_for(lambda: len(named(cluster.events("pool.log"), "slot_crashed")) >= 4, 60, "crashes")
    pool.send_signal(signal.SIGTERM)
    assert pool.wait(timeout=30) == 0
    crashes = named(cluster.events("pool.log"), "slot_crashed")
    assert [e["backoff_s"] for e in crashes[:4]] == [0.2, 0.4, 0.8, 0.8]
    assert all("no model files in /nonexistent" in e["reason"] for e in crashes)
    assert all(e["how"] == "exit code 2" for e in crashes)
    # each restart waits out its backoff (the pool wakes for it, not on its next poll)
    starts = named(cluster.events("pool.log"), "slot_started")[1:]
    for crash, start in zip(crashes[:3], starts, strict=False):
        waited = datetime.fromisoformat(start["timestamp"]) - datetime.fromisoformat(
            crash["timestamp"]
        )
        assert waited.total_seconds() >= crash["backoff_s"] - 0.01


def test_pool_releases_a_killed_workers_job_at_once_and_restarts_the_slot(
    cluster: Cluster, connection: redis.Redis
) -> None:
    cluster.overrides["COSYQ_HEARTBEAT_TTL_S"] = "20"  # so only the pool can be this fast
    pool = cluster.start("pool", "-n", "1", log_name="pool.log")
    job = enqueue(connection, "sleep:2 long")  # killed within a poll of its start
    wait_for(lambda: job.get_status() == "started", 60, "the job to start")
    pid = int(connection.hget(next(iter(connection.keys("cosyq:worker-stats:*"))), "pid"))
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: job.get_status() == "finished", 30, "the job to finish elsewhere")
    assert time.monotonic() - killed_at < 15  # well inside the 20 s heartbeat TTL
    events = cluster.events("pool.log")
    assert [e["how"] for e in named(events, "slot_exited")] == ["signal SIGKILL"]
    assert named(events, "job_released")[0]["job_id"] == job.id
    pool.send_signal(signal.SIGTERM)
    assert pool.wait(timeout=30) == 0


def ended(pid: int) -> bool:
    """Gone, or a zombie nobody has reaped yet (a killed pool's children go to init)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc (Linux); macOS pools exec")
def test_a_killed_pools_workers_finish_their_job_and_stop(
    cluster: Cluster, connection: redis.Redis, pool_start: str
) -> None:
    """SIGKILL to the pool (a supervisor's hard stop) leaves no worker running: an exec'd one
    sees its parent change, a forked one (whose parent is the template, alive while any of its
    forks is) sees the pool's end of its control channel close. Each stops warmly."""
    pool = cluster.start("pool", "-n", "2", log_name="pool.log")
    wait_for(lambda: len(named(cluster.events("pool.log"), "slot_ready")) == 2, 60, "2 slots")
    pids = [e["pid"] for e in named(cluster.events("pool.log"), "slot_started")]
    job = enqueue(connection, "sleep:1 in flight")
    wait_for(lambda: job.get_status() == "started", 30, "the job to start")
    pool.send_signal(signal.SIGKILL)
    assert pool.wait(timeout=10) == -signal.SIGKILL
    wait_for(lambda: all(ended(pid) for pid in pids), 30, f"the {pool_start} workers to end")
    assert job.get_status() == "finished"  # a warm stop: the job in its hands ran to its end
    events = cluster.events("pool.log")
    assert len(named(events, "worker_orphaned")) == 2
    assert connection.smembers("rq:workers") == set()


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc (Linux); macOS pools exec")
def test_a_killed_pools_workers_stop_with_redis_gone_too(
    persistent_redis: LocalRedis, tmp_path: Path, pool_start: str
) -> None:
    """The pool and Redis both gone (a host going down, a test session ending): its workers do
    not wait out the outage for ever, whichever way the pool started them."""
    overrides = {"COSYQ_POOL_START": pool_start}
    cluster = Cluster(redis_url=persistent_redis.url, root=tmp_path, overrides=overrides)
    try:
        pool = cluster.start("pool", "-n", "2", log_name="pool.log")
        wait_for(lambda: len(named(cluster.events("pool.log"), "slot_ready")) == 2, 60, "ready")
        pids = [e["pid"] for e in named(cluster.events("pool.log"), "slot_started")]
        persistent_redis.stop()
        pool.send_signal(signal.SIGKILL)
        assert pool.wait(timeout=10) == -signal.SIGKILL
        wait_for(lambda: all(ended(pid) for pid in pids), 30, f"the {pool_start} workers to end")
        assert len(named(cluster.events("pool.log"), "worker_orphaned")) == 2
    finally:
        cluster.stop_all()
