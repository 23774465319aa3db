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
        # they did notice Redis was gone (idle: at the dequeue; busy: writing an outcome)
        assert named(events, "dequeue_failed") or named(events, "job_outcome_unrecorded")
        assert "Traceback" not in (tmp_path / "pool.log").read_text()
    finally:
        cluster.stop_all()
        connection.close()
