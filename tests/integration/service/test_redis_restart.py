"""Redis restarted mid-run: workers reconnect and every job completes."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import redis

from tests.doubles.harness import (
    Cluster,
    enqueue,
    named,
    statuses,
    wait_for,
)
from workers.tools.local_redis import LocalRedis

# What a worker logs where a Redis call fails and it carries on (workers/service).
OUTAGE_EVENTS = {
    "dequeue_failed",
    "job_outcome_unrecorded",
    "job_not_started",
    "job_bookkeeping_failed",
    "cancel_check_failed",
    "worker_heartbeat_failed",
    "worker_state_unrecorded",
    "housekeeping_redis_error",
    "suspension_check_failed",
    "maintenance_failed",
    "give_back_failed",
}


def test_workers_reconnect_and_every_job_completes(
    persistent_redis: LocalRedis, tmp_path: Path
) -> None:
    cluster = Cluster(redis_url=persistent_redis.url, root=tmp_path)
    connection = redis.Redis.from_url(persistent_redis.url)
    try:
        pool = cluster.start("pool", "-n", "2", log_name="pool.log")
        wait_for(lambda: len(named(cluster.events("pool.log"), "slot_ready")) == 2, 60, "ready")
        jobs = [enqueue(connection, f"sleep:0.3 sentence {i}") for i in range(16)]
        wait_for(lambda: statuses(connection, jobs).count("finished") >= 3, 30, "some jobs")
        persistent_redis.stop()
        time.sleep(3)
        persistent_redis.start()
        wait_for(lambda: statuses(connection, jobs) == ["finished"] * 16, 120, "every job")
        pool.send_signal(signal.SIGTERM)
        assert pool.wait(timeout=30) == 0
        events = cluster.events("pool.log")
        stop = named(events, "pool_stopping")[0]["timestamp"]
        # The workers rode out the outage: none exited before the stop, none crashed.
        assert [e for e in named(events, "slot_exited") if e["timestamp"] < stop] == []
        # they did notice Redis was gone, wherever a worker was when it went (idle: at the
        # dequeue; busy: claiming a job, checking its cancel flag, writing its outcome; any
        # time: the heartbeat or a housekeeping duty): which of these is the timing's choice
        assert [e for e in events if e["event"] in OUTAGE_EVENTS], "no worker saw the outage"
        assert "Traceback" not in (tmp_path / "pool.log").read_text()
    finally:
        cluster.stop_all()
        connection.close()
