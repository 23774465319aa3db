"""Prometheus `/metrics` of a pool (children summed across recycling) and of a lone worker."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import redis

from tests.doubles.harness import Cluster, enqueue, named, statuses, wait_for
from tests.doubles.scrape import Scrape, try_scrape
from workers.tools.local_redis import free_port


def address(port: int) -> str:
    return f"http://127.0.0.1:{port}/metrics"


def scrape_when(port: int, predicate: object, what: str, timeout: float = 60) -> Scrape:
    def check() -> Scrape | None:
        result = try_scrape(address(port))
        return result if result is not None and predicate(result) else None  # type: ignore[operator]

    return wait_for(check, timeout, what, interval=0.2)


def test_pool_metrics_sum_every_child_and_survive_recycling(
    cluster: Cluster, connection: redis.Redis, tmp_path: Path
) -> None:
    port = free_port()
    good = [enqueue(connection, f"sentence {i}") for i in range(8)]
    bad = [enqueue(connection, "invalid"), enqueue(connection, "boom")]
    flaky = enqueue(connection, f"transient:{tmp_path / 'flaky-marker'}", retry=None)
    waiting = [enqueue(connection, "never taken", queue="cosyq-low") for _ in range(2)]
    pool = cluster.start(
        "pool",
        "-n",
        "2",
        "cosyq-default",
        log_name="pool.log",
        COSYQ_MAX_JOBS="3",
        COSYQ_METRICS_PORT=str(port),
    )
    jobs = [*good, flaky]
    wait_for(lambda: statuses(connection, jobs) == ["finished"] * len(jobs), 90, "jobs done")
    wait_for(lambda: statuses(connection, bad) == ["failed"] * 2, 30, "bad jobs failed")

    # Recycled children are gone; two fresh ones idle (their state is published each tick).
    # An idle child told to retire leaves within COSYQ_DEQUEUE_POLL_S: wait for its exit too.
    # A child asked to retire keeps working until the pool grants it (its replacement ready),
    # so wait until every recycle counted has its child gone and its replacement loaded.
    def settled(s: Scrape) -> bool:
        recycled = s.value("cosyq_worker_recycles_total", reason="max_jobs")
        gone = len(named(cluster.events("pool.log"), "slot_exited"))
        loads = s.value("cosyq_model_load_seconds_count")
        idle = s.value("cosyq_workers", state="idle")
        return idle == 2 and recycled >= 1 and gone >= recycled and loads >= 2 + recycled

    result = scrape_when(port, settled, "every recycled child gone, two idle workers")
    queue = "cosyq-default"
    assert result.value("cosyq_jobs_total", queue=queue, outcome="finished") == 9
    assert result.value("cosyq_jobs_total", queue=queue, outcome="failed") == 2
    assert result.value("cosyq_jobs_total", queue=queue, outcome="retried") == 1
    assert result.value("cosyq_job_seconds_count") == 12
    assert result.value("cosyq_stage_seconds_count", stage="llm") == 9
    assert result.value("cosyq_stage_seconds_count", stage="store") == 9
    assert result.value("cosyq_audio_seconds_total") == pytest.approx(9 * 0.25, rel=0.01)
    recycles = result.value("cosyq_worker_recycles_total", reason="max_jobs")
    exits = named(cluster.events("pool.log"), "slot_exited")
    assert 1 <= len(exits) <= recycles  # 12 attempts on a budget of 3: someone recycled
    assert result.value("cosyq_model_load_seconds_count") >= 2 + recycles
    assert result.value("cosyq_workers", state="busy") == 0
    assert result.value("cosyq_workers", state="waiting") == 0
    assert result.value("cosyq_queue_depth", queue="cosyq-low") == len(waiting)
    assert result.value("cosyq_queue_depth", queue=queue) == 0
    rss = result.values("cosyq_worker_rss_bytes")
    assert len(rss) == 2 and all(value > 10e6 for value in rss)  # one series per live child

    # Dead children were folded into one archive per type: the folder does not grow.
    folder = Path(named(cluster.events("pool.log"), "pool_metrics")[0]["folder"])
    names = sorted(path.name for path in folder.glob("*.db"))
    assert "counter_archive.db" in names and "histogram_archive.db" in names
    assert len(names) <= 2 + 4 * 2, names  # archives + (counter, histogram, 2 gauges) per child

    pool.send_signal(signal.SIGTERM)
    assert pool.wait(timeout=30) == 0
    assert not folder.exists()  # the pool removes its folder when it stops


def test_a_lone_worker_serves_its_own_metrics(cluster: Cluster, connection: redis.Redis) -> None:
    port = free_port()
    jobs = [enqueue(connection, f"sentence {i}") for i in range(3)]
    worker = cluster.start("run", log_name="worker.log", COSYQ_METRICS_PORT=str(port))
    wait_for(lambda: statuses(connection, jobs) == ["finished"] * 3, 60, "three jobs")
    result = scrape_when(
        port, lambda s: s.value("cosyq_workers", state="idle") == 1, "the worker idle"
    )
    assert result.value("cosyq_jobs_total", queue="cosyq-default", outcome="finished") == 3
    assert result.value("cosyq_model_load_seconds_count") == 1
    assert result.value("cosyq_queue_depth", queue="cosyq-high") == 0
    assert len(result.values("cosyq_worker_rss_bytes")) == 1
    assert not result.values("process_cpu_seconds_total")  # only cosyq's own families

    # A second worker on the same port is a configuration error: one line, exit 2, no wait.
    second = cluster.start("run", log_name="second.log", COSYQ_METRICS_PORT=str(port))
    assert second.wait(timeout=30) == 2
    text = (cluster.root / "second.log").read_text()
    assert f"COSYQ_METRICS_PORT: cannot serve metrics on 127.0.0.1:{port}" in text
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


def test_metrics_are_off_unless_a_port_is_set(cluster: Cluster, connection: redis.Redis) -> None:
    job = enqueue(connection, "one")
    worker = cluster.start("run", "--burst", log_name="worker.log")
    assert worker.wait(timeout=60) == 0
    assert statuses(connection, [job]) == ["finished"]
    assert not named(cluster.events("worker.log"), "metrics_serving")


@pytest.mark.parametrize("command", [("run",), ("pool", "-n", "1")])
def test_a_fresh_process_serves_every_known_series_at_zero(
    cluster: Cluster, connection: redis.Redis, command: tuple[str, ...]
) -> None:
    """Before any job: every outcome per queue, every recycle reason and every stage exist at
    zero, so alerts and rate() have a series from the first scrape."""
    port = free_port()
    process = cluster.start(*command, log_name="fresh.log", COSYQ_METRICS_PORT=str(port))
    result = scrape_when(
        port, lambda s: s.value("cosyq_workers", state="idle") == 1, "the worker idle"
    )
    for queue in ("cosyq-high", "cosyq-default", "cosyq-low"):
        for outcome in ("finished", "failed", "retried", "refused"):
            assert result.values("cosyq_jobs_total", queue=queue, outcome=outcome) == [0.0]
    for reason in ("max_jobs", "rss", "lifetime", "job_timeout", "model_failed"):
        assert result.values("cosyq_worker_recycles_total", reason=reason) == [0.0]
    for stage in ("queue_wait", "llm", "flow", "store"):
        assert result.values("cosyq_stage_seconds_count", stage=stage) == [0.0]
        assert result.values("cosyq_stage_seconds_bucket", stage=stage, le="+Inf") == [0.0]
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=30) == 0


def test_a_known_series_keeps_its_count_once_it_has_one(
    cluster: Cluster, connection: redis.Redis
) -> None:
    """The zeros fill only what is missing: one finished job is one series at 1, not two."""
    port = free_port()
    job = enqueue(connection, "one")
    worker = cluster.start("run", log_name="worker.log", COSYQ_METRICS_PORT=str(port))
    wait_for(lambda: statuses(connection, [job]) == ["finished"], 60, "the job")
    result = scrape_when(
        port, lambda s: s.value("cosyq_workers", state="idle") == 1, "the worker idle"
    )
    assert result.values("cosyq_jobs_total", queue="cosyq-default", outcome="finished") == [1.0]
    assert result.values("cosyq_jobs_total", queue="cosyq-default", outcome="failed") == [0.0]
    assert result.values("cosyq_stage_seconds_count", stage="llm") == [1.0]
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0
