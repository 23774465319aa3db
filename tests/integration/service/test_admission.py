"""Anyone who can write to Redis must not get code execution on a worker.

Payloads here are pushed straight into Redis (bypassing the producer): foreign callables,
pickled data, malformed hashes. Each is failed with a reason, nothing it names is imported or
called, nothing is unpickled, and the worker goes on to finish the good job queued behind them.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
import zlib
from pathlib import Path
from typing import Any

import redis
from rq import Callback, Queue
from rq.job import Job
from rq.serializers import PickleSerializer

from tests.doubles.harness import Cluster, enqueue, json_queue, named

RQ_WORKER = [sys.executable, "-m", "rq.cli", "worker", "-w", "workers.worker.CosyqWorker"]


class Detonator:
    """Unpickling this runs a shell command that creates a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def push_raw_job(
    connection: redis.Redis, data: bytes, *, queue: str = "cosyq-default", **fields: str
) -> str:
    """A job hash written by hand, as an attacker (or a buggy client) could."""
    job_id = uuid.uuid4().hex
    mapping: dict[str, Any] = {
        "data": data,
        "status": "queued",
        "origin": queue,
        "created_at": "2026-01-01T00:00:00.000000Z",
        "enqueued_at": "2026-01-01T00:00:00.000000Z",
        "description": "raw",
        **fields,
    }
    connection.hset(f"rq:job:{job_id}", mapping=mapping)
    connection.sadd("rq:queues", f"rq:queue:{queue}")
    connection.rpush(f"rq:queue:{queue}", job_id)
    return job_id


def job_data(func: str, args: list[Any], kwargs: Any) -> bytes:
    return zlib.compress(json.dumps([func, None, args, kwargs]).encode())


def failure(connection: redis.Redis, job_id: str) -> dict[str, str]:
    job = Job.fetch(job_id, connection=connection, serializer="json")
    assert job.get_status() == "failed", (job_id, job.get_status())
    return dict(job.meta["cosyq_error"])


def run_burst(cluster: Cluster) -> None:
    worker = cluster.start("run", "--burst", log_name="w.log")
    assert worker.wait(timeout=60) == 0


def test_foreign_callables_are_failed_without_being_called(
    cluster: Cluster, connection: redis.Redis, tmp_path: Path
) -> None:
    marker = tmp_path / "pwned"
    queue = json_queue(connection)
    system = queue.enqueue("os.system", f"touch {marker}")
    shutil_job = queue.enqueue("shutil.rmtree", str(tmp_path))
    with_callback = queue.enqueue(
        "workers.tasks.synthesize", request={"text": "hi"}, on_failure=Callback("os.system")
    )
    good = enqueue(connection, "the good one")
    run_burst(cluster)
    assert not marker.exists() and tmp_path.exists()
    assert "'os.system' is not allowed" in failure(connection, system.id)["message"]
    assert "'shutil.rmtree' is not allowed" in failure(connection, shutil_job.id)["message"]
    assert "failure callback" in failure(connection, with_callback.id)["message"]
    assert good.get_status() == "finished"
    refused = named(cluster.events("w.log"), "job_refused")
    assert {e["job_id"] for e in refused} == {system.id, shutil_job.id, with_callback.id}


def test_pickled_job_is_refused_unread(
    cluster: Cluster, connection: redis.Redis, tmp_path: Path
) -> None:
    marker = tmp_path / "unpickled"
    pickled_queue = Queue("cosyq-default", connection=connection, serializer=PickleSerializer)
    pickled = pickled_queue.enqueue(
        "workers.tasks.synthesize", request=Detonator(marker), meta={"x": Detonator(marker)}
    )
    good = enqueue(connection, "the good one")
    run_burst(cluster)
    assert not marker.exists()
    message = failure(connection, pickled.id)["message"]
    assert "not RQ JSON job data" in message and "pickled" in message
    assert good.get_status() == "finished"


def test_malformed_payloads_fail_with_a_reason_and_the_worker_stays_up(
    cluster: Cluster, connection: redis.Redis
) -> None:
    synth = "workers.tasks.synthesize"
    cases = {
        "garbage": push_raw_job(connection, b"\x00\x01 not zlib, not json"),
        "bad_request": push_raw_job(connection, job_data(synth, [], {"request": {"text": ""}})),
        "unknown_field": push_raw_job(
            connection, job_data(synth, [], {"request": {"text": "hi", "shell": "rm -rf /"}})
        ),
        "not_a_dict": push_raw_job(connection, job_data(synth, [], {"request": "hello"})),
        "positional": push_raw_job(connection, job_data(synth, [{"text": "hi"}], {})),
        "wrong_kwargs": push_raw_job(connection, job_data(synth, [], {"req": {}})),
        "kwargs_list": push_raw_job(connection, job_data(synth, [], ["x"])),
        "bad_status": push_raw_job(
            connection, job_data(synth, [], {"request": {"text": "hi"}}), status="exploded"
        ),
        "webhook": push_raw_job(
            connection,
            job_data(synth, [], {"request": {"text": "hi"}}),
            webhooks=json.dumps([{"url": "http://169.254.169.254/", "job_status": "failed"}]),
        ),
    }
    good = enqueue(connection, "the good one")
    run_burst(cluster)
    reasons = {name: failure(connection, job_id) for name, job_id in cases.items()}
    assert all(r["kind"] == "invalid_request" for r in reasons.values())
    assert "not RQ JSON job data" in reasons["garbage"]["message"]
    assert (
        reasons["bad_request"]["message"] == "text: must not be empty (after trimming whitespace)"
    )
    assert reasons["unknown_field"]["message"] == "shell: unknown field"
    assert "request: must be a JSON object" in reasons["not_a_dict"]["message"]
    assert "positional" in reasons["positional"]["message"]
    assert "do not fit" in reasons["wrong_kwargs"]["message"]
    assert "kwargs must be a JSON object" in reasons["kwargs_list"]["message"]
    assert "unreadable job hash" in reasons["bad_status"]["message"]
    assert "webhooks" in reasons["webhook"]["message"]
    assert good.get_status() == "finished"
    events = cluster.events("w.log")
    assert not [e for e in events if e.get("exception")]  # no traceback soup for any of them


def test_stock_rq_cli_with_pickle_default_still_never_unpickles(
    cluster: Cluster, connection: redis.Redis, redis_url: str, tmp_path: Path
) -> None:
    """`rq worker -w ...CosyqWorker` without `-S json`: RQ would default to pickle; we don't."""
    marker = tmp_path / "unpickled"
    pickled_queue = Queue("cosyq-default", connection=connection, serializer=PickleSerializer)
    pickled = pickled_queue.enqueue(
        "workers.tasks.synthesize", request=Detonator(marker), meta={"x": Detonator(marker)}
    )
    good = enqueue(connection, "the good one")
    command = [*RQ_WORKER, "--url", redis_url, "--burst", "cosyq-default"]
    worker = cluster.spawn(command, "rq.log")
    assert worker.wait(timeout=60) == 0
    assert not marker.exists()
    assert "not RQ JSON job data" in failure(connection, pickled.id)["message"]
    assert good.get_status() == "finished"


def test_rq_cli_with_json_and_max_jobs_processes_jobs(
    cluster: Cluster, connection: redis.Redis, redis_url: str
) -> None:
    jobs = [enqueue(connection, f"sentence {i}") for i in range(3)]
    json_serializer = ["-S", "rq.serializers.JSONSerializer"]
    command = [*RQ_WORKER, *json_serializer, "--url", redis_url, "--max-jobs", "2", "--burst"]
    command.append("cosyq-default")
    worker = cluster.spawn(command, "rq.log")
    assert worker.wait(timeout=60) == 0
    assert [job.get_status() for job in jobs] == ["finished", "finished", "queued"]
    assert named(cluster.events("rq.log"), "worker_ready")  # our start-up ran under rq's CLI
