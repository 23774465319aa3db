"""A Redis that may evict cosyq's keys (a memory limit and a policy other than noeviction) is
warned of once at start-up: by a lone worker, by a pool (not again by each of its workers), and
by `cosyq serve` through the same check (shared/eviction.py). Nothing warned of it: a queued
job's hash evicted is a job lost without a trace. A private redis-server: its settings change."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import RedisServer
from tests.doubles.harness import Cluster, named, wait_for

LIMIT = 1 << 30  # 1 GiB: far above what the test stores, so nothing is evicted meanwhile


@pytest.fixture
def evicting(tmp_path: Path) -> Iterator[tuple[Cluster, redis.Redis]]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    connection = redis.Redis.from_url(server.url)
    connection.config_set("maxmemory", LIMIT)
    connection.config_set("maxmemory-policy", "allkeys-lru")
    cluster = Cluster(redis_url=server.url, root=tmp_path)
    try:
        yield cluster, connection
    finally:
        cluster.stop_all()
        connection.close()
        server.stop()


def warnings(cluster: Cluster, log_name: str) -> list[dict]:
    return named(cluster.events(log_name), "redis_may_evict")


def test_a_lone_worker_warns_of_an_evicting_redis(
    evicting: tuple[Cluster, redis.Redis],
) -> None:
    cluster, connection = evicting
    assert cluster.start("run", "--burst", log_name="lone.log").wait(timeout=60) == 0
    (warned,) = warnings(cluster, "lone.log")
    assert warned["level"] == "warning" and warned["process"] == "worker"
    assert (warned["policy"], warned["maxmemory"]) == ("allkeys-lru", LIMIT)
    assert warned["message"] == (
        "Redis may evict cosyq's keys (maxmemory-policy allkeys-lru, maxmemory 1,073,741,824"
        " bytes): a queued job can be lost without a trace once memory fills; set"
        " maxmemory-policy noeviction"
    )
    connection.config_set("maxmemory-policy", "noeviction")
    assert cluster.start("run", "--burst", log_name="safe.log").wait(timeout=60) == 0
    connection.config_set("maxmemory-policy", "volatile-lru")
    connection.config_set("maxmemory", 0)  # no limit: nothing is ever evicted
    assert cluster.start("run", "--burst", log_name="nolimit.log").wait(timeout=60) == 0
    assert warnings(cluster, "safe.log") == warnings(cluster, "nolimit.log") == []


def test_a_pool_warns_once_not_each_worker(evicting: tuple[Cluster, redis.Redis]) -> None:
    cluster, connection = evicting
    connection.config_set("maxmemory-policy", "volatile-ttl")
    pool = cluster.start("pool", "-n", "2", log_name="pool.log")
    wait_for(lambda: len(named(cluster.events("pool.log"), "worker_ready")) == 2, 60, "2 ready")
    pool.send_signal(signal.SIGTERM)
    assert pool.wait(timeout=60) == 0
    (warned,) = warnings(cluster, "pool.log")
    assert (warned["process"], warned["policy"]) == ("pool", "volatile-ttl")
    assert "a finished job's result can be lost" in warned["message"]
