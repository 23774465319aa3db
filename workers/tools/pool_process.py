"""`cosyq-worker pool` as a child process, for the demo and the soak: both need one that stops
warmly (a first SIGTERM, so jobs finish) and is killed only when that takes too long."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

POOL_STOP_TIMEOUT_S = 120.0  # a warm stop waits for running jobs: the tiny model's are short


@contextmanager
def pool_process(env: dict[str, str], size: int, log_path: Path) -> Iterator[Path]:
    """`cosyq-worker pool -n size` with `env`, its output appended to `log_path` (yielded)."""
    with log_path.open("ab") as log:
        command = [sys.executable, "-m", "workers.cli", "pool", "-n", str(size)]
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield log_path
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=POOL_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
