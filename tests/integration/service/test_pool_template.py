"""COSYQ_POOL_START=template (Linux): the pool forks its workers from one pre-imported template,
and every promise of tests/integration/service/test_pool.py still holds."""

from __future__ import annotations

import os
import signal
import sys
import time
from itertools import pairwise
from pathlib import Path

import pytest
import redis

from tests.doubles.harness import Cluster, enqueue, named, statuses, wait_for
from tests.doubles.scrape import try_scrape
from tests.integration.service.test_pool import loading_intervals
from workers.tools.local_redis import free_port

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the template is Linux only")


@pytest.fixture
def worker_batch_size() -> int:
    """How the pool starts a worker does not depend on its batch size: one run is enough."""
    return 1


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])  # the field after the state


def worker_pids(connection: redis.Redis) -> list[int]:
    return [int(connection.hget(key, "pid")) for key in connection.keys("cosyq:worker-stats:*")]


def test_forked_workers_load_one_at_a_time_recycle_when_granted_and_stop_warm(
    cluster: Cluster, connection: redis.Redis
) -> None:
    port = free_port()
    jobs = [enqueue(connection, f"sentence {i}") for i in range(5)]
    pool = cluster.start(
        "pool",
        "-n",
        "2",
        log_name="pool.log",
        COSYQ_POOL_START="template",
        COSYQ_MAX_JOBS="2",
        COSYQ_METRICS_PORT=str(port),
        COSYQ_ENGINE="tests.doubles.engines:slow_load",
        TESTENGINE_LOAD_S="0.3",
    )
    wait_for(lambda: statuses(connection, jobs) == ["finished"] * 5, 60, "all 5 jobs")
    wait_for(lambda: len(loading_intervals(cluster.events("pool.log"))) >= 3, 60, "a restart")
    wait_for(lambda: len(worker_pids(connection)) == 2, 30, "two live workers")
    for pid in worker_pids(connection):  # forks of the template, which the pool started
        template = parent_of(pid)
        assert template != pool.pid and parent_of(template) == pool.pid
    scraped = wait_for(
        lambda: (
            (s := try_scrape(f"http://127.0.0.1:{port}/metrics"))
            and s.value("cosyq_workers", state="idle") == 2
            and s
        ),
        30,
        "two idle workers in /metrics",
    )
    # every fork's samples are summed, the recycled ones' too; the template serves none
    assert scraped.value("cosyq_jobs_total", queue="cosyq-default", outcome="finished") == 5
    assert len(scraped.values("cosyq_worker_rss_bytes")) == 2
    in_flight = enqueue(connection, "sleep:1 in flight")
    wait_for(lambda: in_flight.get_status() == "started", 30, "the job to start")
    pool.send_signal(signal.SIGTERM)
    assert pool.wait(timeout=30) == 0
    assert in_flight.get_status() == "finished"  # a warm stop, forwarded to the forks
    events = cluster.events("pool.log")
    assert named(events, "pool_template_ready")
    intervals = loading_intervals(events)
    for (_, ready, first), (start, _, second) in pairwise(intervals):
        assert ready <= start, f"{first} and {second} were loading at the same time"
    stop = named(events, "pool_stopping")[0]["timestamp"]
    granted = named(events, "slot_retire_granted")
    for exited in named(events, "slot_exited"):
        if exited["timestamp"] < stop:  # a recycling exit comes only after its slot's grant
            assert exited["reason"] == "max_jobs"
            assert any(
                g["slot"] == exited["slot"] and g["timestamp"] <= exited["timestamp"]
                for g in granted
            )
    assert [e["reason"] for e in named(events, "slot_exited") if e["timestamp"] > stop] == [
        "stop",
        "stop",
    ]


def test_a_killed_fork_has_its_job_released_at_once_and_its_slot_restarted(
    cluster: Cluster, connection: redis.Redis
) -> None:
    cluster.overrides["COSYQ_HEARTBEAT_TTL_S"] = "20"  # so only the pool can be this fast
    pool = cluster.start("pool", "-n", "1", log_name="pool.log", COSYQ_POOL_START="template")
    job = enqueue(connection, "sleep:3 long")
    wait_for(lambda: job.get_status() == "started", 60, "the job to start")
    (pid,) = worker_pids(connection)
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: job.get_status() == "finished", 30, "the job to finish elsewhere")
    assert time.monotonic() - killed_at < 15  # well inside the 20 s heartbeat TTL
    events = cluster.events("pool.log")
    assert [e["how"] for e in named(events, "slot_exited")] == ["signal SIGKILL"]
    assert named(events, "job_released")[0]["job_id"] == job.id
    assert len(named(events, "slot_started")) == 2
    pool.send_signal(signal.SIGTERM)
    assert pool.wait(timeout=30) == 0
