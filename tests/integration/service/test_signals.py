"""Two-stage shutdown: the first SIGTERM/SIGINT finishes the job, a second one stops at once."""

from __future__ import annotations

import signal
import time

import pytest
import redis

from tests.doubles.harness import Cluster, enqueue, named, wait_for


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_first_signal_finishes_the_job_then_exits_zero(
    cluster: Cluster, connection: redis.Redis, signum: signal.Signals
) -> None:
    job = enqueue(connection, "sleep:1.5 finish me")  # signaled within a poll of its start
    waiting = enqueue(connection, "not taken")
    worker = cluster.start("run", log_name="w.log")
    wait_for(lambda: job.get_status() == "started", 30, "the job to start")
    worker.send_signal(signum)
    assert worker.wait(timeout=30) == 0
    assert job.get_status() == "finished"
    # No new job after the stop request. Batched, the second job may have joined the first
    # one's window before the stop (then it is finished) or not (then it waits at the head of
    # its queue): which one is timing, and both are right.
    status = waiting.get_status()
    assert status in ("finished", "queued")
    if status == "queued":
        assert connection.lrange("rq:queue:cosyq-default", 0, -1) == [waiting.id.encode()]
    assert named(cluster.events("w.log"), "worker_stop_requested")[0]["mode"] == "warm"
    assert connection.smembers("rq:workers") == set()


def test_second_signal_gives_the_job_back_and_exits_at_once(
    cluster: Cluster, connection: redis.Redis
) -> None:
    job = enqueue(connection, "sleep:20 interrupted")
    worker = cluster.start("run", log_name="w.log")
    wait_for(lambda: job.get_status() == "started", 30, "the job to start")
    worker.send_signal(signal.SIGTERM)
    time.sleep(1.2)  # a second signal within 1 s is treated as the same Ctrl+C
    sent = time.monotonic()
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 1
    assert time.monotonic() - sent < 5  # not the 20 s job
    job.refresh()
    assert job.get_status() == "queued"  # given back at once, attempt 2 to come
    assert job.meta["cosyq_last_error"]["kind"] == "worker_died"
    assert named(cluster.events("w.log"), "worker_cold_shutdown")
    assert connection.smembers("rq:workers") == set()


def test_idle_worker_stops_at_once_on_first_signal(cluster: Cluster) -> None:
    worker = cluster.start("run", log_name="w.log")
    wait_for(lambda: named(cluster.events("w.log"), "worker_ready"), 30, "ready")
    time.sleep(0.5)  # inside the blocking dequeue
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 0
