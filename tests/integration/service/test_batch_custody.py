"""A batching worker's custody of each job: in its queue, or started under a live heartbeat.

Workers load `tests.doubles.engines:batching`. A job that cannot join a batch (`add_voice`)
popped during a window goes straight back to the head of its queue, so the orphan sweep (at
1.5 s here) never finds it nowhere and a second copy never runs; a streamed job popped during a
window runs in it, ahead of the rows, once; a row past its deadline stores nothing; a cold stop
leaves every job finished or in its queue.
"""

from __future__ import annotations

import hashlib
import signal
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
import pytest
import redis
import soundfile as sf
from rq.job import Job
from rq.registry import StartedJobRegistry

from shared.submitted import record_submitted
from tests.doubles.harness import Cluster, enqueue, json_queue, named, statuses, wait_for
from workers.tools.local_redis import LocalRedis

BATCHING = {
    "COSYQ_ENGINE": "tests.doubles.engines:batching",
    "COSYQ_BATCH_SIZE": "8",
    # the sweep's bound: a job found nowhere twice this far apart is put back. The windows
    # below park a job for 2.5 bounds or more, and each "no second copy" wait is 4/3 of one.
    "COSYQ_ORPHAN_AFTER_S": "1.5",
}
ORPHANED_COPY_S = 2.0  # a second, orphaned copy would have run by now (4/3 of the bound)
QUEUE_KEY = "rq:queue:cosyq-default"


@pytest.fixture
def worker_batch_size() -> int:
    """These tests set COSYQ_BATCH_SIZE themselves: run each once."""
    return 8


def result(job: Job) -> dict:
    found = job.latest_result()
    assert found is not None and isinstance(found.return_value, dict)
    return found.return_value


def finished_lines(cluster: Cluster, logs: list[str], job: Job) -> list[dict]:
    lines = [e for name in logs for e in named(cluster.events(name), "synthesis_finished")]
    return [e for e in lines if e.get("job_id") == job.id]


def enqueue_voice(cluster: Cluster, connection: redis.Redis, name: str) -> Job:
    """An add_voice job (it never joins a batch) on a one-second prompt in the storage folder."""
    prompt = cluster.root / "out" / f"{name}.wav"
    prompt.parent.mkdir(parents=True, exist_ok=True)
    sf.write(prompt, 0.3 * np.sin(np.arange(24000) / 24000 * 2 * np.pi * 220), 24000)
    job = json_queue(connection).enqueue(
        "workers.tasks.add_voice", name=name, prompt_audio=prompt.as_uri(), transcript="a voice"
    )
    record_submitted(connection, [job.id])
    return job


def all_events(cluster: Cluster, logs: list[str], name: str) -> list[dict]:
    return [e for log_name in logs for e in named(cluster.events(log_name), name)]


@pytest.mark.parametrize("workers", [1, 2])
def test_a_job_that_cannot_join_the_window_runs_exactly_once(
    cluster: Cluster, connection: redis.Redis, workers: int
) -> None:
    # 150 steps of 0.05 s (7.5 s): five bounds of the sweep with the job parked
    long = [enqueue(connection, f"seconds:24 long {i}", seed=i) for i in range(2)]
    cluster.start("run", log_name="w1.log", **BATCHING, TESTENGINE_STEP_S="0.05")
    wait_for(lambda: statuses(connection, long) == ["started"] * 2, 30, "the window")
    voice = enqueue_voice(cluster, connection, "parked")
    logs = ["w1.log"]
    if workers == 2:
        time.sleep(1.0)  # popped by the first worker's window by now
        cluster.start("run", log_name="w2.log", **BATCHING, TESTENGINE_STEP_S="0.001")
        logs.append("w2.log")
    wait_for(lambda: statuses(connection, [*long, voice]) == ["finished"] * 3, 60, "all")
    time.sleep(ORPHANED_COPY_S)
    assert len(all_events(cluster, logs, "voice_added")) == 1
    assert len(voice.results()) == 1
    assert all_events(cluster, logs, "job_orphan_requeued") == []


def test_a_streamed_job_sent_to_a_full_window_runs_ahead_of_the_rows_once(
    cluster: Cluster, connection: redis.Redis
) -> None:
    long = [enqueue(connection, f"seconds:48 long {i}", seed=i) for i in range(2)]
    full = {**BATCHING, "COSYQ_BATCH_SIZE": "2"}  # no room left: it is taken from the head
    cluster.start("run", log_name="w.log", **full, TESTENGINE_STEP_S="0.05")
    wait_for(lambda: statuses(connection, long) == ["started"] * 2, 30, "the window")
    streamed = enqueue(connection, "seconds:1 streamed", stream=True, seed=7)
    # the rows need 300 steps of 0.05 s (15 s); the streamed job 6, ahead of them (a wait
    # shorter than the rows, so a slow streamed job times out here rather than below)
    wait_for(lambda: streamed.get_status() == "finished", 12, "the streamed job")
    assert statuses(connection, long) == ["started"] * 2
    stored = result(streamed)
    assert stored["attempt"] == 1 and stored["timings"]["first_chunk_s"] < 10
    wait_for(lambda: statuses(connection, long) == ["finished"] * 2, 90, "the rows")
    time.sleep(ORPHANED_COPY_S)
    assert len(finished_lines(cluster, ["w.log"], streamed)) == 1
    assert all_events(cluster, ["w.log"], "job_orphan_requeued") == []


def test_a_job_cancelled_after_the_window_popped_it_does_not_run(
    cluster: Cluster, connection: redis.Redis
) -> None:
    # 87 steps of 0.05 s (4.4 s): the window is still open when the cancel comes, 1 s in
    long = enqueue(connection, "seconds:14 long", seed=1)
    cluster.start("run", log_name="w.log", **BATCHING, TESTENGINE_STEP_S="0.05")
    wait_for(lambda: long.get_status() == "started", 30, "the window")
    voice = enqueue_voice(cluster, connection, "canceled")
    time.sleep(1.0)  # popped by the window by now
    voice.cancel()
    wait_for(lambda: long.get_status() == "finished", 60, "the window to drain")
    time.sleep(2.0)
    assert voice.get_status() == "canceled"
    assert all_events(cluster, ["w.log"], "voice_added") == []


def test_redis_away_during_a_window_fails_no_job_and_the_worker_stays(
    persistent_redis: LocalRedis, tmp_path: Path
) -> None:
    cluster = Cluster(redis_url=persistent_redis.url, root=tmp_path)
    connection = redis.Redis.from_url(persistent_redis.url)
    try:
        worker = cluster.start("run", log_name="w.log", **BATCHING, TESTENGINE_STEP_S="0.05")
        wait_for(lambda: named(cluster.events("w.log"), "worker_ready"), 30, "ready")
        jobs = [enqueue(connection, f"seconds:{2 + i % 3} sentence {i}", seed=i) for i in range(20)]
        wait_for(lambda: "started" in statuses(connection, jobs), 30, "a window")
        persistent_redis.stop()
        time.sleep(3)
        persistent_redis.start()
        wait_for(lambda: statuses(connection, jobs) == ["finished"] * 20, 120, "every job")
        assert worker.poll() is None  # the window rode the outage out
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0
        assert named(cluster.events("w.log"), "job_refused") == []
    finally:
        cluster.stop_all()
        connection.close()


@pytest.mark.timeout(300)  # above its waits (30 + 60 + 120 s), so a wait names what it waited for
def test_a_timed_out_row_leaves_the_retry_s_file_as_the_retry_wrote_it(
    cluster: Cluster, connection: redis.Redis, tmp_path: Path
) -> None:
    # rows step together: the companions' 112 steps end after the slow row's 100, whatever
    # the load, so the window outlasts the stale row (and the retry, written meanwhile)
    companions = [enqueue(connection, f"seconds:18 keep {i}", seed=i) for i in range(2)]
    slow = json_queue(connection).enqueue(
        "workers.tasks.synthesize", request={"text": "seconds:16 slow"}, job_timeout=2
    )
    record_submitted(connection, [slow.id])
    # w1 takes these three jobs and no more (its job budget), so the retry is w2's: on w1's slow
    # steps the retry would time out again, a third attempt where this test checks the second.
    w1_budget = {"COSYQ_MAX_JOBS": "3", "COSYQ_MAX_JOBS_JITTER": "0"}
    cluster.start("run", log_name="w1.log", **BATCHING, **w1_budget, TESTENGINE_STEP_S="0.1")
    wait_for(lambda: statuses(connection, [*companions, slow]) == ["started"] * 3, 30, "window")
    # w2's first job pays its first-use imports (loudness, quality): that is a warm-up job on
    # the high queue, taken first, so the retry's own 2 s hold only its synthesis (w2's first
    # job timing out at 2 s left the retry queued with no worker, a failure seen in CI)
    warm = enqueue(connection, "seconds:1 warm", queue="cosyq-high", seed=9)
    retry_worker = {**BATCHING, "COSYQ_BATCH_SIZE": "1", "TESTENGINE_STEP_S": "0.001"}
    cluster.start("run", log_name="w2.log", **retry_worker)
    wait_for(lambda: statuses(connection, [*companions, warm]) == ["finished"] * 3, 60, "all")
    wait_for(lambda: slow.get_status() == "finished", 120, "the retry")  # loaded hosts
    time.sleep(1.0)  # the stale row (10 s on the model) ended before the companions (11.2 s)
    stored = result(slow)
    assert stored["attempt"] == 2
    path = Path(unquote(urlparse(stored["uri"]).path))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == stored["sha256"]
    assert finished_lines(cluster, ["w1.log"], slow) == []
    assert [e["job_id"] for e in named(cluster.events("w1.log"), "batch_row_dropped")] == [slow.id]


def test_a_cold_stop_during_a_window_leaves_every_job_finished_or_in_its_queue_in_order(
    cluster: Cluster, connection: redis.Redis
) -> None:
    batched = enqueue(connection, "seconds:2 batched", seed=1)
    first = enqueue(connection, "sleep:8 streamed one", stream=True)
    second = enqueue(connection, "sleep:8 streamed two", stream=True)
    jobs = [batched, first, second]
    worker = cluster.start("run", log_name="w.log", **BATCHING, TESTENGINE_STEP_S="0.05")
    wait_for(lambda: first.get_status() == "started", 30, "the first streamed job")
    worker.send_signal(signal.SIGTERM)
    time.sleep(1.2)  # a second signal within 1 s is treated as the same Ctrl+C
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=10) == 1
    found = statuses(connection, jobs)
    assert set(found) <= {"finished", "queued"}, found
    assert found[1:] == ["queued", "queued"]  # each sleeps 8 s: neither could have finished
    queued = [raw.decode() for raw in connection.lrange(QUEUE_KEY, 0, -1)]
    assert queued == [job.id for job, status in zip(jobs, found, strict=True) if status == "queued"]
    assert len(StartedJobRegistry("cosyq-default", connection=connection)) == 0
