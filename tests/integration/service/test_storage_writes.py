"""Storage failures during a job: a passing S3 outage is retried inside the attempt (the audio
is not synthesized again) and the job finishes; a permanent refusal fails the job as `storage`,
not `internal`, once, and leaves no temp file behind."""

from __future__ import annotations

from pathlib import Path

import redis

from tests.doubles.harness import Cluster, enqueue, named, wait_for
from tests.doubles.s3_servers import RestartableS3, s3_client

from .test_storage_startup import s3_env


def test_s3_outage_during_the_write_is_retried_and_the_job_finishes(
    cluster: Cluster, connection: redis.Redis, restartable_s3: RestartableS3
) -> None:
    client = s3_client(restartable_s3.url)
    client.create_bucket(Bucket="flaky")
    worker = cluster.start(
        "run",
        log_name="w.log",
        COSYQ_STORAGE_WRITE_ATTEMPTS="30",
        COSYQ_STORAGE_RETRY_BACKOFF_S="0.2",
        COSYQ_STORAGE_RETRY_BACKOFF_MAX_S="0.5",
        **s3_env(restartable_s3.url, "s3://flaky/out"),
    )
    wait_for(lambda: named(cluster.events("w.log"), "worker_ready"), 30, "the worker")
    restartable_s3.stop()  # after the start-up probe passed, before the job's write
    job = enqueue(connection, "hello", output_key="flaky/one")
    retries = wait_for(
        lambda: named(cluster.events("w.log"), "storage_write_retry"), 30, "a write retry"
    )
    assert "cannot write s3://flaky/out/flaky/one.wav" in retries[0]["error"]
    assert job.get_status() == "started"  # the same attempt, waiting for storage
    restartable_s3.start()
    wait_for(lambda: job.get_status() == "finished", 30, "the job")
    worker.terminate()
    assert worker.wait(timeout=30) == 0
    result = job.latest_result().return_value
    assert result["attempt"] == 1 and result["uri"] == "s3://flaky/out/flaky/one.wav"
    body = client.get_object(Bucket="flaky", Key="out/flaky/one.wav")["Body"].read()
    assert len(body) == result["bytes"]
    assert len(named(cluster.events("w.log"), "synthesis_finished")) == 1
    keys = [item["Key"] for item in client.list_objects_v2(Bucket="flaky")["Contents"]]
    assert keys == ["out/flaky/one.wav"]  # no probe object, no partial upload


def test_a_permanent_write_failure_is_a_storage_error_and_leaves_no_temp_file(
    cluster: Cluster, connection: redis.Redis
) -> None:
    out = cluster.root / "out"
    (out / "taken.wav").mkdir(parents=True)  # a folder where the audio should go
    (out / "taken.wav" / "keep").write_text("not ours")
    job = enqueue(connection, "hello", output_key="taken")
    good = enqueue(connection, "fine", output_key="fine")
    worker = cluster.start("run", "--burst", log_name="w.log")
    assert worker.wait(timeout=60) == 0
    job.refresh()
    assert job.get_status() == "failed"
    error = job.meta["cosyq_error"]
    assert error["kind"] == "storage"
    assert error["message"] == f"cannot write {out / 'taken.wav'}: Is a directory"
    assert job.meta["cosyq_attempt"] == 1 and job.retries_left == 0
    assert not named(cluster.events("w.log"), "storage_write_retry")
    failed = [e for e in named(cluster.events("w.log"), "job_failed") if e["job_id"] == job.id]
    assert failed[0]["kind"] == "storage" and failed[0]["will_retry"] is False
    assert good.get_status() == "finished"
    leftovers = sorted(str(p.relative_to(out)) for p in Path(out).rglob("*"))
    assert leftovers == [".fine.wav.cosyq.json", "fine.wav", "taken.wav", "taken.wav/keep"]
