"""Failures at the job boundary: permanent ones fail once with a short reason, transient ones
are retried with backoff, unexpected ones fail with their traceback kept for debugging."""

from __future__ import annotations

import time
from pathlib import Path

import redis
from rq.job import Job
from rq.registry import FailedJobRegistry

from tests.doubles.harness import Cluster, enqueue, json_queue, named, wait_for


def exc_info(job: Job) -> str:
    """What RQ recorded as the failure (the failed Result's exc_string)."""
    result = job.latest_result()
    assert result is not None
    return result.exc_string or ""


def test_permanent_error_fails_once_with_a_short_reason(
    cluster: Cluster, connection: redis.Redis
) -> None:
    bad = enqueue(connection, "invalid please")
    unknown_voice = enqueue(connection, "hello", voice="nobody")
    missing = (cluster.root / "model" / "missing.wav").as_uri()
    missing_prompt = enqueue(connection, "hello", prompt_audio=missing, prompt_text="hi")
    outside_prompt = enqueue(
        connection, "hello", prompt_audio="file:///etc/hostname", prompt_text="hi"
    )
    good = enqueue(connection, "fine")
    worker = cluster.start("run", "--burst", log_name="w.log")
    assert worker.wait(timeout=60) == 0
    for job, reason in (
        (bad, "text: the test engine refuses this text"),
        (
            unknown_voice,
            "voice: no voice named 'nobody' is registered for tenant default or shared "
            "(cosyq voices list, GET /v1/audio/voices)",
        ),
        (missing_prompt, f"{missing}: no such file"),
        (
            outside_prompt,
            "prompt_audio: file:///etc/hostname is outside the folders this worker reads "
            "prompts from (COSYQ_PROMPT_ROOTS)",
        ),
    ):
        job.refresh()
        assert job.get_status() == "failed"
        assert job.meta["cosyq_error"] == {"kind": "invalid_request", "message": reason}
        assert exc_info(job) == f"invalid_request: {reason}"  # no traceback soup
        assert job.meta["cosyq_attempt"] == 1 and job.retries_left == 0
    assert good.get_status() == "finished"
    failed = named(cluster.events("w.log"), "job_failed")
    assert len(failed) == 4 and not any(e.get("exception") for e in failed)


def test_transient_error_is_retried_with_backoff(
    cluster: Cluster, connection: redis.Redis, tmp_path: Path
) -> None:
    marker = tmp_path / "fault-once"
    job = enqueue(connection, f"transient:{marker} hello")
    worker = cluster.start("run", log_name="w.log", COSYQ_RETRY_BACKOFF_S="2")
    wait_for(lambda: job.get_status() == "scheduled", 30, "the retry to be scheduled")
    scheduled_at = time.monotonic()
    wait_for(lambda: job.get_status() == "finished", 30, "the retry to finish")
    assert time.monotonic() - scheduled_at > 1.0  # the backoff was honoured
    result = job.latest_result()
    assert result is not None and result.return_value["attempt"] == 2
    job.refresh()
    assert job.meta["cosyq_last_error"]["kind"] == "transient"
    assert "cosyq_error" not in job.meta
    worker.terminate()
    assert worker.wait(timeout=30) == 0


def test_unexpected_error_is_internal_not_retried_and_keeps_its_traceback(
    cluster: Cluster, connection: redis.Redis
) -> None:
    job = enqueue(connection, "boom")
    worker = cluster.start("run", "--burst", log_name="w.log")
    assert worker.wait(timeout=60) == 0
    job.refresh()
    assert job.get_status() == "failed"
    assert job.meta["cosyq_error"] == {
        "kind": "internal",
        "message": "RuntimeError: test engine bug",
    }
    assert "Traceback" in exc_info(job)
    assert named(cluster.events("w.log"), "job_failed")[0].get("exception")


def test_an_internal_error_quoting_a_url_keeps_none_of_its_credentials(
    cluster: Cluster, connection: redis.Redis
) -> None:
    """The reason, the traceback RQ keeps in Redis and the log line all mask the password;
    the reason and the traceback (whose last line is the reason of a job without one), which
    the job's tenant reads, the user name too."""
    job = enqueue(connection, "fail: cannot reach http://minio:job-pass-4T@10.0.0.5:9000/b")
    worker = cluster.start("run", "--burst", log_name="w.log")
    assert worker.wait(timeout=60) == 0
    job.refresh()
    assert job.meta["cosyq_error"]["message"].endswith("http://***@10.0.0.5:9000/b")
    assert "Traceback" in exc_info(job) and "http://***@10.0.0.5" in exc_info(job)
    assert "job-pass-4T" not in exc_info(job) and "minio" not in exc_info(job)
    log = (cluster.root / "w.log").read_text()
    assert "job-pass-4T" not in log and "minio:***@" in log  # the operator's


def test_a_job_requeued_by_hand_drops_its_old_failure_and_counts_on(
    cluster: Cluster, connection: redis.Redis
) -> None:
    late = cluster.root / "model" / "late.wav"
    job = enqueue(connection, "hello", prompt_audio=late.as_uri(), prompt_text="a test prompt")
    assert cluster.start("run", "--burst", log_name="w1.log").wait(timeout=60) == 0
    job.refresh()
    assert job.get_status() == "failed" and job.meta["cosyq_error"]["kind"] == "invalid_request"
    late.write_bytes((cluster.root / "model" / "prompt.wav").read_bytes())
    FailedJobRegistry(queue=json_queue(connection)).requeue(job.id)  # what `rq requeue` does
    assert cluster.start("run", "--burst", log_name="w2.log").wait(timeout=60) == 0
    job.refresh()
    assert job.get_status() == "finished"
    assert "cosyq_error" not in job.meta and job.meta["cosyq_attempt"] == 2
    result = job.return_value()
    assert isinstance(result, dict) and result["attempt"] == 2
