"""No job lost: a worker killed mid-job (SIGKILL, a native crash) loses nothing, fast.

The workers here run bare (no pool), as under launchd or supervisord: the dead worker's job
must be noticed by the other workers' reapers through its expired heartbeat.
"""

from __future__ import annotations

import signal
import time

import pytest
import redis
from rq import Retry

from producer import CosyqClient
from shared import keys
from shared.errors import StreamFailedError
from shared.settings import load_settings
from tests.doubles.harness import Cluster, enqueue, named, wait_for
from workers.service.reaper import Reaper

DEADLINE_S = 30  # the bound, from the kill to the job being done or failed


def test_sigkill_mid_job_is_finished_by_another_worker(
    cluster: Cluster, connection: redis.Redis
) -> None:
    # Both workers are ready before the job exists: whichever takes it is killed (its name
    # is host.pid.random), however long the other took to start on a busy machine.
    workers = {}
    for log_name in ("a.log", "b.log"):
        process = cluster.start("run", log_name=log_name)
        workers[process.pid] = (process, log_name)
    for _, log_name in workers.values():
        wait_for(lambda n=log_name: named(cluster.events(n), "worker_ready"), 60, log_name)
    job = enqueue(connection, "sleep:2 long sentence")  # killed within a poll of its start
    wait_for(lambda: job.get_status() == "started", 30, "a worker to start the job")
    job.refresh()
    taker = int((job.worker_name or "").split(".")[-2])
    (first, _), [(second, second_log)] = workers.pop(taker), list(workers.values())
    first.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    wait_for(lambda: job.get_status() == "finished", DEADLINE_S, "the job to be finished")
    assert time.monotonic() - killed_at < DEADLINE_S
    result = job.latest_result()
    assert result is not None and result.return_value["worker_pid"] == second.pid
    assert result.return_value["attempt"] == 2
    released = named(cluster.events(second_log), "job_released")
    assert [(e["job_id"], e["outcome"]) for e in released] == [(job.id, "retried")]


def test_worker_dying_on_every_attempt_fails_the_job_with_worker_died(
    cluster: Cluster, connection: redis.Redis
) -> None:
    job = enqueue(connection, "kill poison", retry=Retry(max=1))
    deadline = time.monotonic() + 2 * DEADLINE_S
    for attempt in (1, 2):
        process = cluster.start("run", log_name=f"attempt{attempt}.log")
        assert process.wait(timeout=30) == -signal.SIGKILL  # the engine killed its worker
    # A third worker starts, reaps the second attempt at start-up: no retries left.
    survivor = cluster.start("run", log_name="survivor.log")
    wait_for(lambda: job.get_status() == "failed", DEADLINE_S, "the job to fail")
    assert time.monotonic() < deadline
    job.refresh()
    assert job.meta["cosyq_error"]["kind"] == "worker_died"
    assert "worker died" in job.meta["cosyq_error"]["message"]
    assert survivor.poll() is None  # the reaping worker is fine


def test_native_crash_without_retries_left_fails_at_once_on_next_start(
    cluster: Cluster, connection: redis.Redis
) -> None:
    cluster.overrides["COSYQ_MAX_RETRIES"] = "0"  # the worker's default policy: no retries
    crashing = enqueue(connection, "exit:139 segfault-like")
    assert cluster.start("run", log_name="a.log").wait(timeout=30) == 139
    started = time.monotonic()
    cluster.start("run", log_name="b.log")
    wait_for(lambda: crashing.get_status() == "failed", DEADLINE_S, "the crashed job to fail")
    assert time.monotonic() - started < DEADLINE_S
    crashing.refresh()
    assert crashing.meta["cosyq_error"]["kind"] == "worker_died"
    released = named(cluster.events("b.log"), "job_released")
    assert [(e["job_id"], e["outcome"]) for e in released] == [(crashing.id, "failed")]


@pytest.mark.parametrize("retries", [0, 1])
def test_a_streamed_job_whose_worker_died_ends_its_stream_with_the_error(
    cluster: Cluster,
    connection: redis.Redis,
    redis_url: str,
    monkeypatch: pytest.MonkeyPatch,
    retries: int,
) -> None:
    cluster.overrides["COSYQ_MAX_RETRIES"] = str(retries)
    retry = Retry(max=retries) if retries else None
    job = enqueue(connection, "exit:139 crash", stream=True, retry=retry)
    assert cluster.start("run", log_name="a.log").wait(timeout=30) == 139
    if retries:  # released here, so no worker takes the retry and restarts the stream first
        holder = connection.get(keys.job_heartbeat_key(job.id))
        assert holder is not None
        reaper = Reaper(connection, ["cosyq-default"], heartbeat_ttl_s=DEADLINE_S)
        assert [r.outcome for r in reaper.reap(dead_worker=holder.decode())] == ["retried"]
        first = connection.xrange(keys.audio_stream_key(job.id))[-1][1]
        assert first[b"error_kind"] == b"worker_died" and b"requeued" in first[b"error_message"]
        # The retry crashes too: a reader goes past the first error entry to the final one.
        assert cluster.start("run", log_name="b.log").wait(timeout=30) == 139
    cluster.start("run", log_name="c.log")  # reaps the dead attempt at start-up
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_STREAM_BLOCK_MS", "200")
    started = time.monotonic()
    with (
        CosyqClient(load_settings(env_file=None)) as client,
        pytest.raises(StreamFailedError) as failed,
    ):
        list(client.stream(job.id, timeout=DEADLINE_S))
    assert time.monotonic() - started < DEADLINE_S
    assert failed.value.kind == "worker_died"
    assert "requeued" not in str(failed.value)  # the final failure, not a retried attempt's
    key = keys.audio_stream_key(job.id)
    entries = connection.xrange(key)
    assert entries and entries[-1][1][b"error_kind"] == b"worker_died"
    assert connection.ttl(key) > 0
