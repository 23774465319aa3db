"""COSYQ_BACKEND=coreml on Linux: the worker refuses to start with one line, takes no job."""

from __future__ import annotations

import sys

import pytest
import redis

from tests.doubles.harness import Cluster, enqueue

MESSAGE = "Core ML runs only on macOS; use COSYQ_BACKEND=torch"


@pytest.mark.skipif(sys.platform == "darwin", reason="on macOS Core ML is allowed to start")
def test_coreml_on_linux_exits_nonzero_with_one_line(
    cluster: Cluster, connection: redis.Redis
) -> None:
    job = enqueue(connection, "never taken")
    worker = cluster.start(
        "run",
        log_name="w.log",
        COSYQ_ENGINE="workers.service.default_engine:engine_from_settings",
        COSYQ_BACKEND="coreml",
    )
    assert worker.wait(timeout=30) == 2
    lines = (cluster.root / "w.log").read_text().splitlines()
    assert f"cosyq-worker: {MESSAGE}" in lines
    assert not any("Traceback" in line for line in lines)
    assert job.get_status() == "queued"
    assert connection.smembers("rq:workers") == set()
