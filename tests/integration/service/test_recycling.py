"""Recycling: a worker exits 0 after its job budget, an RSS spike, its lifetime, a job timeout."""

from __future__ import annotations

import pytest
import redis

from tests.doubles.harness import Cluster, enqueue, named, statuses, wait_for


def test_exits_zero_after_max_jobs_and_deregisters(
    cluster: Cluster, connection: redis.Redis
) -> None:
    jobs = [enqueue(connection, f"sentence {i}") for i in range(5)]
    worker = cluster.start("run", log_name="w.log", COSYQ_MAX_JOBS="3")
    assert worker.wait(timeout=60) == 0
    assert sorted(statuses(connection, jobs)) == ["finished"] * 3 + ["queued"] * 2
    retiring = named(cluster.events("w.log"), "worker_retiring")
    assert [e["reason"] for e in retiring] == ["max_jobs"]
    assert retiring[0]["jobs_done"] == 3
    assert connection.smembers("rq:workers") == set()  # deregistered, not left to expire
    assert connection.keys("cosyq:worker-stats:*") == []
    result = jobs[0].latest_result()
    assert result is not None and result.return_value is not None
    assert result.return_value["worker_pid"] == worker.pid
    assert result.return_value["worker_name"].endswith(tuple("0123456789abcdef"))


# A fresh process's memory: a fork's resident set counts the template's pages it shares (torch
# among them), which an exec-started worker of a light engine never loads.
@pytest.mark.worker_exec
def test_rss_limit_recycles_after_the_job_that_grew(
    cluster: Cluster, connection: redis.Redis, worker_batch_size: int
) -> None:
    small, leaky, after = (
        enqueue(connection, "small"),
        enqueue(connection, "leak:400 big"),
        enqueue(connection, "after"),
    )
    worker = cluster.start("run", log_name="w.log", COSYQ_MAX_RSS_MB="300")
    assert worker.wait(timeout=60) == 0
    # Batched, "after" was already held when the leaky job ended: it is finished, not dropped.
    last = "queued" if worker_batch_size == 1 else "finished"
    assert statuses(connection, [small, leaky, after]) == ["finished", "finished", last]
    retiring = named(cluster.events("w.log"), "worker_retiring")
    assert [e["reason"] for e in retiring] == ["rss"]
    assert retiring[0]["rss_mb"] > 300


def test_lifetime_ends_an_idle_worker(cluster: Cluster) -> None:
    worker = cluster.start("run", log_name="w.log", COSYQ_MAX_LIFETIME_S="2")
    assert worker.wait(timeout=30) == 0
    assert [e["reason"] for e in named(cluster.events("w.log"), "worker_retiring")] == ["lifetime"]


def test_job_timeout_recycles_and_retries_the_job(
    cluster: Cluster, connection: redis.Redis
) -> None:
    slow = enqueue(connection, "sleep:5 too slow")
    worker = cluster.start("run", log_name="w.log", COSYQ_JOB_TIMEOUT_S="1", COSYQ_MAX_RETRIES="1")
    assert worker.wait(timeout=60) == 0
    events = cluster.events("w.log")
    assert [e["reason"] for e in named(events, "worker_retiring")] == ["job_timeout"]
    failed = named(events, "job_failed")
    assert failed[0]["kind"] == "transient" and "timed out after 1 s" in failed[0]["reason"]
    slow.refresh()
    assert slow.get_status() == "queued"  # given back for its one retry
    assert slow.retries_left == 0
    wait_for(lambda: connection.llen("rq:queue:cosyq-default") == 1, 5, "the retry")
