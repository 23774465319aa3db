"""No stop loses a popped job (issue 15): a signal right after the pop, while the pop waits,
a cold stop between pop and start, a Redis hiccup while giving the job back.

Each worker is a CosyqWorker subclass from tests/doubles/racy_workers.py that delivers the
signal itself at the chosen moment, started by the stock `rq worker -w` CLI (no pool).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from rq.job import Job

from shared.keys import QUEUES_IN_PRIORITY_ORDER
from tests.doubles.harness import Cluster, all_done, enqueue, named, wait_for
from tests.doubles.racy_workers import RACE_JOB_ENV
from workers.tools.local_redis import LocalRedis

DEFAULT_QUEUE_KEY = "rq:queue:cosyq-default"


def rq_worker(cluster: Cluster, redis_url: str, worker_class: str, **extra: str):  # type: ignore[no-untyped-def]
    command = [sys.executable, "-m", "rq.cli", "worker", "--url", redis_url]
    command += ["-w", f"tests.doubles.racy_workers.{worker_class}"]
    command += ["-S", "rq.serializers.JSONSerializer", *QUEUES_IN_PRIORITY_ORDER]
    return cluster.spawn(command, "w.log", **extra)


@contextlib.contextmanager
def own_redis(tmp_path: Path, batch_size: int) -> Iterator[tuple[LocalRedis, Cluster]]:
    """A redis-server of the test's own (it stops and starts it) and a Cluster on it."""
    server = LocalRedis(tmp_path / "redis")
    server.start()
    cluster = Cluster(
        redis_url=server.url, root=tmp_path, overrides={"COSYQ_BATCH_SIZE": str(batch_size)}
    )
    try:
        yield server, cluster
    finally:
        cluster.stop_all()
        server.stop()


def at_its_dequeue(url: str) -> bool:
    """Whether a worker registered on this Redis is idle (its dequeue has begun)."""
    with redis.Redis.from_url(url) as probe:
        return any(probe.hget(key, "state") == b"idle" for key in probe.smembers("rq:workers"))


def assert_waiting_in_order(connection: redis.Redis, jobs: list[Job]) -> None:
    """Every job queued, never started, in this order at the head of its queue; no leftovers."""
    queued = [entry.decode() for entry in connection.lrange(DEFAULT_QUEUE_KEY, 0, -1)]
    assert queued == [job.id for job in jobs]
    for job in jobs:
        job.refresh()
        assert job.get_status(refresh=False) == "queued"
        assert job.started_at is None and not job.worker_name
    assert connection.zcard("rq:wip:cosyq-default") == 0  # nothing left as "started"
    assert connection.keys("rq:intermediate:*") == []


def run_the_rest(cluster: Cluster, connection: redis.Redis, jobs: list[Job]) -> None:
    """A plain worker afterwards runs every job that was given back."""
    worker = cluster.start("run", "--burst", log_name="after.log")
    assert worker.wait(timeout=60) == 0
    wait_for(all_done(connection, jobs), 10, "the given-back jobs to finish")


def test_sigterm_right_after_the_pop_puts_the_job_back_at_the_head(
    cluster: Cluster, connection: redis.Redis, redis_url: str
) -> None:
    first, second = enqueue(connection, "first"), enqueue(connection, "second")
    worker = rq_worker(cluster, redis_url, "SignalAfterPop")
    assert worker.wait(timeout=60) == 0
    assert_waiting_in_order(connection, [first, second])
    events = cluster.events("w.log")
    assert [e["job_id"] for e in named(events, "job_pushed_back")] == [first.id]
    assert named(events, "worker_stop_requested")[0]["mode"] == "warm"
    assert connection.smembers("rq:workers") == set()
    run_the_rest(cluster, connection, [first, second])


def test_sigterm_while_the_pop_waits_gives_back_the_job_it_then_receives(
    cluster: Cluster, connection: redis.Redis, redis_url: str
) -> None:
    job = enqueue(connection, "arrives during the wait")
    connection.lrem(DEFAULT_QUEUE_KEY, 0, job.id)  # the worker's thread pushes it mid-pop
    # A long poll: the pop can only return because the job arrived after the signal.
    worker = rq_worker(
        cluster,
        redis_url,
        "SignalWhileBlocked",
        COSYQ_DEQUEUE_POLL_S="30",
        **{RACE_JOB_ENV: job.id},
    )
    assert worker.wait(timeout=60) == 0
    assert_waiting_in_order(connection, [job])
    assert [e["job_id"] for e in named(cluster.events("w.log"), "job_pushed_back")] == [job.id]
    run_the_rest(cluster, connection, [job])


def test_cold_stop_between_pop_and_start_gives_the_job_back_then_exits(
    cluster: Cluster, connection: redis.Redis, redis_url: str
) -> None:
    job = enqueue(connection, "taken, then a second signal")
    worker = rq_worker(cluster, redis_url, "ColdAfterPop")
    assert worker.wait(timeout=60) == 1  # the cold-stop exit code
    assert_waiting_in_order(connection, [job])
    events = cluster.events("w.log")
    assert [e["custody"] for e in named(events, "worker_cold_shutdown")] == ["taking"]
    assert [e["job_id"] for e in named(events, "job_pushed_back")] == [job.id]
    assert connection.smembers("rq:workers") == set()
    run_the_rest(cluster, connection, [job])


def test_redis_hiccup_while_giving_back_is_waited_out(
    cluster: Cluster, connection: redis.Redis, redis_url: str
) -> None:
    job = enqueue(connection, "given back through a dropped connection")
    worker = rq_worker(cluster, redis_url, "HiccupAfterPop")
    assert worker.wait(timeout=60) == 0
    assert_waiting_in_order(connection, [job])
    events = cluster.events("w.log")
    assert len(named(events, "job_push_back_failed")) == 1
    assert [e["job_id"] for e in named(events, "job_pushed_back")] == [job.id]


def test_sigterm_during_a_redis_outage_lets_an_idle_worker_leave(
    worker_batch_size: int, tmp_path: Path
) -> None:
    """A pop that never got an answer holds nothing: a stop need not wait for Redis."""
    with own_redis(tmp_path, worker_batch_size) as (server, cluster):
        worker = cluster.start("run", log_name="w.log")
        wait_for(lambda: named(cluster.events("w.log"), "worker_ready"), 60, "ready")
        # RQ's bootstrap writes to Redis after the worker said ready (registration, its state):
        # an outage met there is waited out there. The dequeue marks the worker idle just
        # before its pop: from then on its next Redis call is the pop.
        wait_for(lambda: at_its_dequeue(server.url), 60, "the worker at its dequeue")
        server.stop()
        wait_for(lambda: named(cluster.events("w.log"), "dequeue_failed"), 30, "the outage seen")
        stopped_at = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        assert time.monotonic() - stopped_at < 10  # not "until Redis is back"


@pytest.mark.parametrize(
    ("worker_class", "waited"),
    [
        ("RedisGoneBeforeRegistration", "worker_register_waiting"),
        ("RedisGoneBeforeStarted", "worker_state_unrecorded"),
    ],
)
def test_redis_gone_between_ready_and_the_first_pop_is_waited_out(
    worker_batch_size: int, tmp_path: Path, worker_class: str, waited: str
) -> None:
    """RQ's bootstrap writes to Redis after the worker said ready (registration, the pubsub
    subscription, the `started` state): an outage there is an outage like any other, waited
    out, never a crash (a clean-clone run lost a worker to one, the window met by chance)."""
    with own_redis(tmp_path, worker_batch_size) as (server, cluster):
        worker = rq_worker(cluster, server.url, worker_class)
        met = lambda: named(cluster.events("w.log"), waited) or worker.poll() is not None  # noqa: E731
        wait_for(met, 60, "the outage met")
        assert worker.poll() is None, (tmp_path / "w.log").read_text()[-3000:]  # no crash
        server.stop()  # reaps the server the worker shut down
        server.start()  # the same port, empty
        connection = redis.Redis.from_url(server.url)
        job = enqueue(connection, "a job after the outage")
        wait_for(lambda: job.get_status() == "finished", 60, "the job after the outage")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        assert "Traceback" not in (tmp_path / "w.log").read_text()
        connection.close()
