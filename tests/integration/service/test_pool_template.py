"""COSYQ_POOL_START=template (Linux): the pool forks its workers from one pre-imported template,
and every promise of tests/integration/service/test_pool.py still holds."""

from __future__ import annotations

import os
import signal
import sys
import time
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


def test_forked_workers_load_one_at_a_time_are_summed_in_metrics_and_stop_warm(
    cluster: Cluster, connection: redis.Redis
) -> None:
    port = free_port()
    jobs = [enqueue(connection, f"sentence {i}") for i in range(4)]
    pool = cluster.start(
        "pool",
        "-n",
        "2",
        log_name="pool.log",
        COSYQ_POOL_START="template",
        COSYQ_METRICS_PORT=str(port),
        COSYQ_ENGINE="tests.doubles.engines:slow_load",
        TESTENGINE_LOAD_S="0.3",
    )
    wait_for(lambda: statuses(connection, jobs) == ["finished"] * 4, 60, "all 4 jobs")
    wait_for(lambda: len(named(cluster.events("pool.log"), "slot_ready")) == 2, 30, "2 slots")
    pids = wait_for(lambda: len(p := worker_pids(connection)) == 2 and p, 30, "two live workers")
    for pid in pids:  # forks of the template, which the pool started
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
    # every fork's samples are summed; the template's own (zeros) are not served
    assert scraped.value("cosyq_jobs_total", queue="cosyq-default", outcome="finished") == 4
    assert len(scraped.values("cosyq_worker_rss_bytes")) == 2
    in_flight = [enqueue(connection, "sleep:1.5 in flight") for _ in range(2)]
    wait_for(lambda: statuses(connection, in_flight) == ["started"] * 2, 30, "both to start")
    pool.send_signal(signal.SIGTERM)
    assert pool.wait(timeout=30) == 0
    assert statuses(connection, in_flight) == ["finished"] * 2  # a warm stop, forwarded
    events = cluster.events("pool.log")
    assert named(events, "pool_template_ready")
    (_, first_ready, _), (second_start, _, _) = loading_intervals(events)
    assert first_ready <= second_start  # one slot loads at a time
    assert len(named(events, "worker_stop_requested")) == 2
    assert [e["reason"] for e in named(events, "slot_exited")] == ["stop", "stop"]


def test_a_killed_fork_has_its_job_released_at_once_and_a_recycled_one_is_replaced(
    cluster: Cluster, connection: redis.Redis
) -> None:
    cluster.overrides["COSYQ_HEARTBEAT_TTL_S"] = "20"  # so only the pool can be this fast
    pool = cluster.start(
        "pool", "-n", "1", log_name="pool.log", COSYQ_POOL_START="template", COSYQ_MAX_JOBS="1"
    )
    job = enqueue(connection, "sleep:3 long")
    wait_for(lambda: job.get_status() == "started", 60, "the job to start")
    (pid,) = worker_pids(connection)
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: job.get_status() == "finished", 30, "the job to finish elsewhere")
    assert time.monotonic() - killed_at < 15  # well inside the 20 s heartbeat TTL
    # the second fork did its one job: it retires when granted, and a third one replaces it
    wait_for(lambda: len(named(cluster.events("pool.log"), "slot_ready")) == 3, 30, "a third")
    pool.send_signal(signal.SIGTERM)
    assert pool.wait(timeout=30) == 0
    events = cluster.events("pool.log")
    assert named(events, "job_released")[0]["job_id"] == job.id
    killed, recycled, stopped = named(events, "slot_exited")
    assert (killed["how"], recycled["how"], stopped["how"]) == (
        "signal SIGKILL",
        "exit code 0",
        "exit code 0",
    )
    assert (recycled["reason"], stopped["reason"]) == ("max_jobs", "stop")
    (granted,) = named(events, "slot_retire_granted")
    assert granted["timestamp"] <= recycled["timestamp"]


def test_a_fork_that_fails_to_load_backs_off_with_its_reason(cluster: Cluster) -> None:
    pool = cluster.start(
        "pool",
        "-n",
        "1",
        "--backoff-initial",
        "0.2",
        "--backoff-max",
        "0.4",
        log_name="pool.log",
        COSYQ_POOL_START="template",
        COSYQ_ENGINE="tests.doubles.engines:failing",
    )
    wait_for(lambda: len(named(cluster.events("pool.log"), "slot_crashed")) >= 3, 60, "crashes")
    pool.send_signal(signal.SIGTERM)
    assert pool.wait(timeout=30) == 0
    crashes = named(cluster.events("pool.log"), "slot_crashed")
    assert [e["backoff_s"] for e in crashes[:3]] == [0.2, 0.4, 0.4]
    assert all("no model files in /nonexistent" in e["reason"] for e in crashes)
    assert all(e["how"] == "exit code 2" for e in crashes)
