"""Storage that goes bad mid-run: after a job failed as `storage` the worker probes storage
before its next job. A probe that fails stops it taking jobs: at most the jobs in flight fail,
the rest stay queued, the worker exits as a failed start does (one line naming the storage URL,
exit code 2, `cosyq status`'s start-failure row, the pool's backoff). A probe that passes (one
object in the way) lets it carry on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import redis
from rq.registry import StartedJobRegistry

from shared.start_failures import start_failures
from tests.doubles.harness import (
    REPO_ROOT,
    Cluster,
    enqueue,
    json_queue,
    named,
    statuses,
    wait_for,
)

from .test_storage_startup import EXIT_START_FAILED

WORKER = [sys.executable, "-m", "workers.cli"]


class TurnsReadOnly:
    """A storage folder that turns read-only under a running worker, for real.

    As root (file modes do not stop root) the worker runs in its own mount namespace on a bind
    mount that is remounted read-only there; otherwise the folder is made 0555.
    """

    def __init__(self, root: Path) -> None:
        self.folder = root / "out-bound"
        self.folder.mkdir()
        self.as_root = os.geteuid() == 0
        self.cause = "Read-only file system" if self.as_root else "Permission denied"
        self.url = self.folder.as_uri()
        self.backing = root / "out-source" if self.as_root else self.folder  # what was written

    def spawn(self, cluster: Cluster, args: list[str], log_name: str) -> subprocess.Popen[bytes]:
        command = [*WORKER, *args]
        if self.as_root:
            self.backing.mkdir()
            mount = 'mount --bind "$1" "$2" && shift 2 && exec "$@"'
            paths = [str(self.backing), str(self.folder)]
            command = ["unshare", "-m", "sh", "-c", mount, "sh", *paths, *WORKER, *args]
        return cluster.spawn(command, log_name, COSYQ_STORAGE_URL=self.url)

    def turn_read_only(self, process: subprocess.Popen[bytes]) -> None:
        if self.as_root:
            remount = ["mount", "-o", "remount,bind,ro", str(self.folder)]
            subprocess.run(["nsenter", "-t", str(process.pid), "-m", *remount], check=True)
        else:
            self.folder.chmod(0o555)


def refusal_lines(path: Path, url: str) -> list[str]:
    line = f"cosyq-worker: storage {url} is not usable (permanent): "
    return [row for row in path.read_text().splitlines() if row.startswith(line)]


def test_storage_turning_read_only_stops_the_worker_and_keeps_the_queue(
    cluster: Cluster, connection: redis.Redis, worker_batch_size: int
) -> None:
    storage = TurnsReadOnly(cluster.root)
    worker = storage.spawn(cluster, ["run"], "w.log")
    first = enqueue(connection, "before", output_key="first")
    wait_for(lambda: first.get_status() == "finished", 60, "the first job")
    storage.turn_read_only(worker)
    jobs = [enqueue(connection, f"job {i}", output_key=f"job-{i}") for i in range(10)]
    assert worker.wait(timeout=60) == EXIT_START_FAILED
    for job in jobs:
        job.refresh()
    failed = [job for job in jobs if job.get_status() == "failed"]
    assert 1 <= len(failed) <= worker_batch_size  # only what was in flight
    for job in failed:
        assert job.meta["cosyq_error"]["kind"] == "storage"
        assert storage.cause in job.meta["cosyq_error"]["message"]
    queued = set(json_queue(connection).get_job_ids())
    rest = [job for job in jobs if job not in failed]
    assert all(job.get_status() == "queued" and job.id in queued for job in rest)
    assert len(failed) + len(rest) == 10
    assert StartedJobRegistry("cosyq-default", connection=connection).get_job_ids() == []
    (said,) = refusal_lines(cluster.root / "w.log", storage.url)
    assert storage.cause in said
    (recheck,) = named(cluster.events("w.log"), "storage_rechecked")
    assert recheck["ok"] is False and recheck["after_job"] in {job.id for job in failed}
    (row,) = start_failures(connection)
    assert storage.url in row.reason and storage.cause in row.reason
    assert row.failures == 1 and row.slot == "-"
    left = sorted(p.name for p in storage.backing.iterdir())
    assert left == [".first.wav.cosyq.json", "first.wav"]  # its note; no temp, no probe


def test_one_write_in_the_way_is_probed_and_the_worker_keeps_going(
    cluster: Cluster, connection: redis.Redis
) -> None:
    out = cluster.root / "out"
    (out / "taken.wav").mkdir(parents=True)  # this one object cannot be written
    worker = cluster.start("run", log_name="w.log")
    taken = enqueue(connection, "hello", output_key="taken")
    wait_for(lambda: taken.get_status() == "failed", 60, "the failed job")
    taken.refresh()
    assert taken.meta["cosyq_error"]["kind"] == "storage"
    (recheck,) = wait_for(lambda: named(cluster.events("w.log"), "storage_rechecked"), 30, "probe")
    assert recheck["ok"] is True and recheck["after_job"] == taken.id
    later = [enqueue(connection, f"fine {i}", output_key=f"fine-{i}") for i in range(3)]
    wait_for(lambda: all(job.get_status() == "finished" for job in later), 60, "later jobs")
    assert worker.poll() is None
    assert start_failures(connection) == []
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0


def test_a_pool_backs_off_a_worker_whose_storage_was_lost(
    cluster: Cluster, connection: redis.Redis
) -> None:
    storage = TurnsReadOnly(cluster.root)
    backoff = ["--backoff-initial", "0.5", "--backoff-max", "1"]
    pool = storage.spawn(cluster, ["pool", "-n", "1", *backoff], "pool.log")
    first = enqueue(connection, "before", output_key="first")
    wait_for(lambda: first.get_status() == "finished", 60, "the first job")
    storage.turn_read_only(pool)  # its children share its mount namespace
    jobs = [enqueue(connection, f"job {i}", output_key=f"job-{i}") for i in range(4)]
    wait_for(lambda: named(cluster.events("pool.log"), "slot_crashed")[1:], 60, "two crashes")
    crashed = named(cluster.events("pool.log"), "slot_crashed")
    assert crashed[0]["how"] == f"exit code {EXIT_START_FAILED}"
    assert storage.url in crashed[0]["reason"] and storage.cause in crashed[0]["reason"]
    assert [row["failures"] for row in crashed[:2]] == [1, 2]  # the lost storage counted
    assert "finished" not in statuses(connection, jobs)
    status = subprocess.run(
        [*WORKER[:2], "producer.cli", "status"],
        cwd=REPO_ROOT,
        env=cluster.env(COSYQ_STORAGE_URL=storage.url),
        capture_output=True,
        text=True,
        check=True,
    )
    shown = " ".join(status.stdout.replace("│", " ").split())  # table cells fold long reasons
    assert "workers that cannot start (1)" in shown and "exit code 2" in shown
    pool.send_signal(signal.SIGTERM)
    assert pool.wait(timeout=30) == 0
