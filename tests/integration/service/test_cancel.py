"""Canceling jobs against real worker processes (one at a time and batched, `cluster` runs both).

Workers that cancel a running job load `tests.doubles.engines:batching`, which decodes in steps
of TESTENGINE_STEP_S and asks the request's `should_stop` before each step, as the real engine's
LLM loop does (the others, whose jobs are canceled before or after they run, the instant
engine). The tests
assert what holds whatever the timing: a canceled job ends `canceled` (never failed, never
retried), stores nothing, and the worker stays up and takes its next job.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from rq.job import Job
from rq.registry import CanceledJobRegistry, FailedJobRegistry, StartedJobRegistry

from producer.client import CosyqClient
from shared import keys
from shared.audio_notes import NOTE_SUFFIX
from shared.errors import JobCanceledError, StreamFailedError
from shared.settings import load_settings
from tests.doubles.harness import Cluster, enqueue, json_queue, named, statuses, wait_for

ENGINE = {"COSYQ_ENGINE": "tests.doubles.engines:batching", "TESTENGINE_STEP_S": "0.05"}
# where no job is canceled mid-run, the queue side is all a test needs: the instant engine
# (tests/doubles/engines.py:fast), whose worker does not load torch as the batching one does
QUEUE_SIDE = {"COSYQ_ENGINE": "tests.doubles.engines:fast"}
LONG = "seconds:20 long"  # 125 steps of 0.05 s: about 6 s alone


@pytest.fixture
def client(redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[CosyqClient]:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_STREAM_BLOCK_MS", "200")
    with CosyqClient(load_settings(env_file=None)) as made:
        yield made


def stored(cluster: Cluster, job: Job) -> list[Path]:
    """The job's audio files (its notes, shared/audio_notes.py, are not counted)."""
    files = (cluster.root / "out").rglob(f"*{job.id}*")
    return [path for path in files if not path.name.endswith(NOTE_SUFFIX)]


def synthesized(cluster: Cluster, job: Job) -> list[dict]:
    return [
        e for e in named(cluster.events("w.log"), "synthesis_finished") if e["job_id"] == job.id
    ]


def assert_canceled(connection: redis.Redis, cluster: Cluster, job: Job) -> None:
    """Canceled in RQ's own books, in no other registry, nothing stored, its flag gone."""
    assert statuses(connection, [job]) == ["canceled"]
    assert job.id in CanceledJobRegistry("cosyq-default", connection=connection)
    assert job.id not in FailedJobRegistry("cosyq-default", connection=connection)
    assert job.id not in StartedJobRegistry("cosyq-default", connection=connection)
    assert job.id not in json_queue(connection).job_ids
    assert stored(cluster, job) == [] and synthesized(cluster, job) == []


def test_a_queued_job_canceled_never_runs(
    cluster: Cluster, connection: redis.Redis, client: CosyqClient
) -> None:
    doomed = enqueue(connection, "seconds:1 doomed")
    kept = enqueue(connection, "seconds:1 kept")
    outcome = client.cancel(doomed.id)
    assert (outcome.verdict, outcome.state) == ("canceled", "queued")
    assert client.cancel(doomed.id).verdict == "already_canceled"
    worker = cluster.start("run", "--burst", log_name="w.log", **QUEUE_SIDE)
    assert worker.wait(timeout=60) == 0
    assert statuses(connection, [kept]) == ["finished"]
    assert_canceled(connection, cluster, doomed)
    with pytest.raises(JobCanceledError):
        client.result(doomed.id, timeout=0)


def test_a_running_job_stops_stores_nothing_and_the_worker_goes_on(
    cluster: Cluster, connection: redis.Redis, client: CosyqClient
) -> None:
    worker = cluster.start("run", log_name="w.log", **ENGINE)
    long = enqueue(connection, LONG)
    wait_for(lambda: statuses(connection, [long]) == ["started"], 30, "the long job to start")
    assert client.cancel(long.id).verdict == "stopping"
    after = enqueue(connection, "seconds:1 after")
    wait_for(lambda: statuses(connection, [long, after]) == ["canceled", "finished"], 30, "both")
    assert_canceled(connection, cluster, long)
    assert connection.exists(keys.cancel_key(long.id)) == 0
    assert worker.poll() is None  # still up
    with pytest.raises(JobCanceledError) as raised:
        client.result(long.id, timeout=0)
    assert raised.value.kind == "canceled"
    assert named(cluster.events("w.log"), "job_canceled")[0]["job_id"] == long.id
    failed = [e for e in named(cluster.events("w.log"), "job_failed") if e["job_id"] == long.id]
    assert failed == []  # a cancel is logged as one, never as a failure (issue 45)


def test_a_finished_job_is_left_as_it_is(
    cluster: Cluster, connection: redis.Redis, client: CosyqClient
) -> None:
    done = enqueue(connection, "seconds:1 done")
    worker = cluster.start("run", "--burst", log_name="w.log", **QUEUE_SIDE)
    assert worker.wait(timeout=60) == 0
    before = client.result(done.id, timeout=0)
    outcome = client.cancel(done.id)
    assert (outcome.verdict, outcome.state, outcome.changed) == ("already_ended", "finished", False)
    assert client.result(done.id, timeout=0) == before
    assert connection.exists(keys.cancel_key(done.id)) == 0
    assert len(stored(cluster, done)) == 1


def test_a_streamed_job_canceled_mid_run_ends_its_stream_with_canceled(
    cluster: Cluster, connection: redis.Redis, client: CosyqClient
) -> None:
    cluster.start("run", log_name="w.log", **ENGINE)
    streamed = enqueue(connection, LONG, stream=True)
    wait_for(lambda: statuses(connection, [streamed]) == ["started"], 30, "the job to start")
    client.cancel(streamed.id)
    with pytest.raises(StreamFailedError) as failed:
        list(client.stream(streamed.id, timeout=30))
    assert failed.value.kind == "canceled"
    wait_for(lambda: statuses(connection, [streamed]) == ["canceled"], 30, "canceled")
    assert_canceled(connection, cluster, streamed)


def test_a_canceled_running_job_with_a_webhook_records_job_canceled(
    cluster: Cluster, connection: redis.Redis, client: CosyqClient
) -> None:
    url = "https://hooks.example.com/"
    cluster.start("run", log_name="w.log", COSYQ_WEBHOOK_ALLOWED_URLS=url, **ENGINE)
    long = enqueue(connection, LONG, webhook={"url": url + "x"})
    wait_for(lambda: statuses(connection, [long]) == ["started"], 30, "the job to start")
    client.cancel(long.id)
    wait_for(lambda: statuses(connection, [long]) == ["canceled"], 30, "canceled")
    events = [
        {k.decode(): v.decode() for k, v in fields.items()}
        for _, fields in connection.xrange(keys.WEBHOOK_OUTBOX)
    ]
    assert [(e["job_id"], e["event"]) for e in events] == [(long.id, "job.canceled")]


@pytest.mark.parametrize("worker_batch_size", [8])
def test_a_canceled_row_leaves_and_the_other_row_finishes(
    cluster: Cluster, connection: redis.Redis, client: CosyqClient, worker_batch_size: int
) -> None:
    doomed = enqueue(connection, LONG, seed=1)
    kept = enqueue(connection, "seconds:8 kept", seed=2)
    cluster.start("run", log_name="w.log", **ENGINE)
    wait_for(lambda: statuses(connection, [doomed, kept]) == ["started"] * 2, 30, "two rows")
    client.cancel(doomed.id)
    wait_for(lambda: statuses(connection, [doomed, kept]) == ["canceled", "finished"], 60, "both")
    assert_canceled(connection, cluster, doomed)
    assert len(stored(cluster, kept)) == 1
    assert client.result(kept.id, timeout=0).attempt == 1
