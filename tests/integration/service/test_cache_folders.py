"""A cache folder the worker cannot write is refused when `run` or `pool` loads its settings:
one line naming the setting, exit 2, before Redis, storage or the model. It failed where the
worker first wrote: a PermissionError in the engine's load error, after the checkpoints had been
hashed. Root writes a 0555 folder whatever its mode, so as root the worker runs without
CAP_DAC_OVERRIDE (setpriv), as a service user would meet the folder."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import redis

from tests.doubles.harness import BEFORE_ANY_BATCH, Cluster, enqueue, named

pytestmark = pytest.mark.worker_exec  # the subject is the start

EXIT_START_FAILED = 2  # workers.service.commands


def as_a_service_user(command: list[str]) -> list[str]:
    """`command` as a process that file modes bind: root without its override of them."""
    if os.geteuid() != 0:
        return command
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("root ignores file modes and setpriv (util-linux) is not installed")
    dropped = "-dac_override,-dac_read_search"
    return [setpriv, "--bounding-set", dropped, "--inh-caps", dropped, *command]


@BEFORE_ANY_BATCH
@pytest.mark.parametrize("args", [("run", "--burst"), ("pool", "-n", "1")])
def test_an_unwritable_hash_cache_refuses_the_start(
    args: tuple[str, ...], cluster: Cluster, connection: redis.Redis
) -> None:
    folder = cluster.root / "hashes"
    folder.mkdir(mode=0o555)
    folder.chmod(0o555)
    job = enqueue(connection, "never taken")
    command = as_a_service_user([sys.executable, "-m", "workers.cli", *args])
    worker = cluster.spawn(command, "w.log", COSYQ_HASH_CACHE_DIR=str(folder))
    assert worker.wait(timeout=60) == EXIT_START_FAILED
    text = (cluster.root / "w.log").read_text()
    said = [line for line in text.splitlines() if "COSYQ_HASH_CACHE_DIR" in line]
    assert said == [
        f"cosyq-worker: COSYQ_HASH_CACHE_DIR={folder} cannot be written by this process"
        " (Permission denied): a worker keeps checkpoint hashes there; make it writable or"
        " point COSYQ_HASH_CACHE_DIR elsewhere"
    ]
    assert not named(cluster.events("w.log"), "worker_loading")
    assert list(folder.iterdir()) == []
    assert job.get_status() == "queued"


@BEFORE_ANY_BATCH
def test_a_missing_hash_cache_is_made_and_left_empty(cluster: Cluster, tmp_path: Path) -> None:
    folder = tmp_path / "not" / "yet"
    worker = cluster.start("run", "--burst", log_name="w.log", COSYQ_HASH_CACHE_DIR=str(folder))
    assert worker.wait(timeout=60) == 0
    assert folder.is_dir() and list(folder.iterdir()) == []  # the probe file is gone
