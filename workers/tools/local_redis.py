"""A private `redis-server` on a free port, for the demo and the tests.

A user's machine has no Redis listening, and a developer's may have one holding real data:
we never touch a Redis we did not start. This starts the OS package's `redis-server` with
persistence off in a scratch folder, waits until it answers, and stops it afterwards.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType

import redis

from shared.errors import CosyqError

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalRedis:
    """Start/stop one redis-server we own (restartable on the same port).

    `persistent=True` keeps an fsync'ed append-only file in `workdir`, so a restart on the same
    port comes back with every key (the tests that restart Redis mid-run use it).
    """

    def __init__(self, workdir: Path, port: int | None = None, *, persistent: bool = False) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.persistent = persistent
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise CosyqError(
                "redis-server not found: install it (apt install redis-server / brew install "
                "redis) or set COSYQ_REDIS_URL to a Redis you run"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        command = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                   "--dir", str(self.workdir)]  # fmt: skip
        if self.persistent:
            command += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            command += ["--appendonly", "no"]
        self.process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self._wait_until_ready()

    def _wait_until_ready(self) -> None:
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + START_TIMEOUT_S
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        self.stop()
                        raise CosyqError(
                            f"redis-server on port {self.port} did not start"
                        ) from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process = None

    def __enter__(self) -> LocalRedis:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
