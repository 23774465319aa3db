"""Storage a worker cannot write stops it before it takes a job: it exits non-zero with one line
naming the storage URL and the cause, the pool backs off, and `cosyq status` shows why. A
transient outage at start is waited out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import redis

from tests.doubles.harness import BEFORE_ANY_BATCH, REPO_ROOT, Cluster, enqueue, named, wait_for
from tests.doubles.s3_servers import AuthS3, RestartableS3, s3_client

# Workers start with exec, as a supervisor starts them: storage is refused at a fresh start.
pytestmark = pytest.mark.worker_exec

EXIT_START_FAILED = 2  # workers.service.commands: every start-up failure (settings, model, storage)


def s3_env(url: str, storage_url: str, key_id: str = "testing", secret: str = "testing") -> dict:
    return {
        "COSYQ_STORAGE_URL": storage_url,
        "COSYQ_S3_ENDPOINT_URL": url,
        "COSYQ_S3_REGION": "us-east-1",
        "COSYQ_S3_ACCESS_KEY_ID": key_id,
        "COSYQ_S3_SECRET_ACCESS_KEY": secret,
        "COSYQ_S3_MAX_ATTEMPTS": "1",
    }


def assert_refused(cluster: Cluster, log_name: str, url: str, cause: str) -> None:
    """The one stderr line, and no worker that ever said it was ready."""
    text = (cluster.root / log_name).read_text()
    line = f"cosyq-worker: storage {url} is not usable (permanent): "
    (said,) = [row for row in text.splitlines() if row.startswith(line)]
    assert cause in said, said
    assert not named(cluster.events(log_name), "worker_ready")


@BEFORE_ANY_BATCH
def test_unwritable_storage_exits_at_start_naming_url_and_cause(
    cluster: Cluster,
    connection: redis.Redis,
    restartable_s3: RestartableS3,
    auth_s3: AuthS3,
) -> None:
    job = enqueue(connection, "never taken")
    (cluster.root / "afile").write_text("in the way")
    under_a_file = (cluster.root / "afile" / "sub").as_uri()
    cases = [
        ("file.log", under_a_file, {"COSYQ_STORAGE_URL": under_a_file}, "Not a directory"),
        (
            "bucket.log",
            "s3://no-such-bucket-at-start/out",
            s3_env(restartable_s3.url, "s3://no-such-bucket-at-start/out"),
            "no such bucket (NoSuchBucket, HTTP 404)",
        ),
        (
            "keys.log",
            "s3://checked/out",
            s3_env(auth_s3.url, "s3://checked/out", auth_s3.key_id, "wrong-secret"),
            "the secret key does not match (wrong credentials)",
        ),
    ]
    for log_name, url, env, cause in cases:
        worker = cluster.start("run", log_name=log_name, **env)
        assert worker.wait(timeout=60) == EXIT_START_FAILED
        assert_refused(cluster, log_name, url, cause)
        assert "wrong-secret" not in (cluster.root / log_name).read_text()
    assert job.get_status() == "queued"
    assert connection.smembers("rq:workers") == set()
    assert (cluster.root / "afile").read_text() == "in the way"


@BEFORE_ANY_BATCH
def test_read_only_folder_exits_at_start(cluster: Cluster) -> None:
    """A read-only bind mount when we are root (root ignores file modes), else a 0555 folder."""
    target = cluster.root / "ro-out"
    target.mkdir()
    env = {"COSYQ_STORAGE_URL": target.as_uri()}
    command = [sys.executable, "-m", "workers.cli", "run"]
    if os.geteuid() == 0:
        source = cluster.root / "rw-src"
        source.mkdir()
        mount = 'mount --bind -o ro "$1" "$2" && shift 2 && exec "$@"'
        command = ["unshare", "-m", "sh", "-c", mount, "sh", str(source), str(target), *command]
        cause = "Read-only file system"
    else:
        target.chmod(0o555)
        cause = "Permission denied"
    worker = cluster.spawn(command, "ro.log", **env)
    assert worker.wait(timeout=60) == EXIT_START_FAILED
    assert_refused(cluster, "ro.log", target.as_uri(), cause)
    assert list(target.iterdir()) == []


@BEFORE_ANY_BATCH
def test_pool_backs_off_and_status_shows_why(cluster: Cluster, connection: redis.Redis) -> None:
    (cluster.root / "afile").write_text("in the way")
    url = (cluster.root / "afile" / "sub").as_uri()
    pool = cluster.start(
        "pool",
        "-n",
        "1",
        "--backoff-initial",
        "0.2",
        "--backoff-max",
        "0.4",
        log_name="pool.log",
        COSYQ_STORAGE_URL=url,
    )
    crashed = wait_for(
        lambda: named(cluster.events("pool.log"), "slot_crashed")[2:], 60, "three crashes"
    )
    first, second, third = named(cluster.events("pool.log"), "slot_crashed")[:3]
    assert [first["failures"], second["failures"], third["failures"]] == [1, 2, 3]
    assert [first["backoff_s"], second["backoff_s"], third["backoff_s"]] == [0.2, 0.4, 0.4]
    assert crashed[0]["how"] == f"exit code {EXIT_START_FAILED}"
    assert "Not a directory" in crashed[0]["reason"] and url in crashed[0]["reason"]
    status = subprocess.run(
        [sys.executable, "-m", "producer.cli", "status"],
        cwd=REPO_ROOT,
        env=cluster.env(COSYQ_STORAGE_URL=url),
        capture_output=True,
        text=True,
        check=True,
    )
    shown = " ".join(status.stdout.replace("│", " ").split())  # table cells fold long reasons
    assert "workers that cannot start (1)" in shown
    assert "Not a directory" in shown and "exit code 2" in shown
    pool.send_signal(signal.SIGTERM)
    assert pool.wait(timeout=30) == 0


def test_s3_down_at_start_is_waited_out_then_the_worker_serves(
    cluster: Cluster, connection: redis.Redis, restartable_s3: RestartableS3
) -> None:
    s3_client(restartable_s3.url).create_bucket(Bucket="down-at-start")
    restartable_s3.stop()
    job = enqueue(connection, "after the outage")
    worker = cluster.start(
        "run",
        "--burst",
        log_name="w.log",
        COSYQ_STORAGE_RETRY_BACKOFF_S="0.2",
        COSYQ_STORAGE_RETRY_BACKOFF_MAX_S="0.5",
        **s3_env(restartable_s3.url, "s3://down-at-start/out"),
    )
    retry = wait_for(lambda: named(cluster.events("w.log"), "storage_probe_retry"), 30, "a retry")
    assert "cannot write s3://down-at-start/out/" in retry[0]["cause"]
    assert job.get_status() == "queued"  # not ready, not taking jobs
    restartable_s3.start()
    assert worker.wait(timeout=60) == 0
    ready = named(cluster.events("w.log"), "storage_ready")[0]
    assert ready["attempts"] >= 2 and ready["url"] == "s3://down-at-start/out"
    assert job.get_status() == "finished"


def test_a_good_start_clears_the_recorded_failure(
    cluster: Cluster, connection: redis.Redis
) -> None:
    (cluster.root / "afile").write_text("in the way")
    bad = cluster.start(
        "run", log_name="bad.log", COSYQ_STORAGE_URL=(cluster.root / "afile").as_uri()
    )
    assert bad.wait(timeout=60) == EXIT_START_FAILED
    (key,) = connection.keys("cosyq:start-failure:*")
    assert connection.hget(key, "failures") == b"1" and 0 < connection.ttl(key) <= 3600
    good = cluster.start("run", "--burst", log_name="good.log")
    assert good.wait(timeout=60) == 0
    assert not connection.exists(key)
    assert named(cluster.events("good.log"), "storage_ready")
