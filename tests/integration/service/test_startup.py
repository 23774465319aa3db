"""Start-up: load once and warm up before the first job; refuse to start rather than take jobs
that cannot run; publish stats for `cosyq status` that vanish when the worker does."""

from __future__ import annotations

import pytest
import redis

from tests.doubles.harness import BEFORE_ANY_BATCH, Cluster, enqueue, named, wait_for

# Workers start with exec, as a supervisor starts them: the subject is the start itself.
pytestmark = pytest.mark.worker_exec


@BEFORE_ANY_BATCH
def test_model_that_fails_to_load_exits_nonzero_and_takes_no_job(
    cluster: Cluster, connection: redis.Redis
) -> None:
    job = enqueue(connection, "never taken")
    for engine, message in (
        ("tests.doubles.engines:failing", "no model files in /nonexistent"),
        ("tests.doubles.engines:broken", "RuntimeError: test engine crashed while loading"),
        ("tests.doubles.nowhere:load", "cannot import tests.doubles.nowhere"),
    ):
        worker = cluster.start("run", log_name=f"{engine}.log", COSYQ_ENGINE=engine)
        assert worker.wait(timeout=30) == 2
        log_text = (cluster.root / f"{engine}.log").read_text()
        assert message in log_text
        assert "cosyq-worker: " in log_text  # the one clear line on stderr
    assert job.get_status() == "queued"
    assert connection.smembers("rq:workers") == set()


def test_worker_ready_reports_load_and_host_facts(cluster: Cluster) -> None:
    worker = cluster.start(
        "run",
        "--burst",
        log_name="w.log",
        TESTENGINE_LOAD_S="0.3",
        COSYQ_ENGINE="tests.doubles.engines:slow_load",
        COSYQ_THREADS="1",
        COSYQ_QUALITY_IMPORT_AT_START="true",  # the product's default; the suite's is off
    )
    assert worker.wait(timeout=60) == 0
    events = cluster.events("w.log")
    ready = named(events, "worker_ready")[0]
    assert ready["load_s"] >= 0.3 and ready["warm_up_s"] >= 0.1 and ready["imports_s"] > 0
    assert {"platform", "arch", "backend", "device", "threads", "model"} <= ready.keys()
    assert ready["threads"] == 1 and ready["translated"] is False
    loading = named(events, "worker_loading")[0]
    assert loading["timestamp"] <= ready["timestamp"]


def test_stats_hash_is_published_and_disappears(cluster: Cluster, connection: redis.Redis) -> None:
    job = enqueue(connection, "sleep:1.5 busy")
    worker = cluster.start("run", log_name="w.log")
    wait_for(lambda: job.get_status() == "started", 30, "the job to start")
    (key,) = wait_for(lambda: connection.keys("cosyq:worker-stats:*"), 10, "a stats hash")
    stats = {k.decode(): v.decode() for k, v in connection.hgetall(key).items()}
    assert stats["state"] == "busy" and stats["current_job"] == job.id
    assert stats["pid"] == str(worker.pid) and float(stats["rss_mb"]) > 10
    assert stats["backend"] == "test" and stats["device"] == "cpu"
    assert 0 < connection.pttl(key) <= 2000  # COSYQ_HEARTBEAT_TTL_S in these tests
    wait_for(lambda: job.get_status() == "finished", 30, "the job")
    wait_for(lambda: connection.hget(key, "jobs_done") == b"1", 5, "jobs_done to count")
    worker.terminate()
    assert worker.wait(timeout=30) == 0
    assert not connection.exists(key)
