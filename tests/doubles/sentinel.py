"""A Redis master, a replica and a sentinel, all started on free ports (never a Redis we did not
start). `redis-server --sentinel` is Sentinel itself (Debian's redis-sentinel is the same
binary), so the redis-server package is all the failover test needs."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis
from redis.sentinel import Sentinel

from workers.tools.local_redis import free_port

SERVICE = "cosyq"
START_TIMEOUT_S = 15.0


class SentinelSet:
    """master + replica + one sentinel (quorum 1) watching the master as SERVICE."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.master_port, self.replica_port, self.sentinel_port = (free_port() for _ in range(3))
        self.processes: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return f"redis+sentinel://127.0.0.1:{self.sentinel_port}/{SERVICE}/0"

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server not found: apt install redis-server (or brew install redis)")
        self._server(binary, "master", self.master_port)
        self._server(binary, "replica", self.replica_port, "--replicaof", "127.0.0.1",
                     str(self.master_port))  # fmt: skip
        self._wait(lambda: self._link_status(self.replica_port) == "up", "replica")
        config = self.workdir / "sentinel.conf"  # Sentinel rewrites it: a file of its own
        config.write_text(
            f"port {self.sentinel_port}\nbind 127.0.0.1\ndir {self.workdir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.master_port} 1\n"
            f"sentinel down-after-milliseconds {SERVICE} 2000\n"
            f"sentinel failover-timeout {SERVICE} 10000\n"
        )
        self._spawn([binary, str(config), "--sentinel"], "sentinel")
        self._wait(self._sentinel_up, "the sentinel")
        self._quicken_sentinel()
        self._wait(self._replica_known, "the sentinel to see the replica")

    def master_port_now(self) -> int:
        """The master as clients see it (SENTINEL MASTERS, as redis-py asks; GET-MASTER-ADDR
        answers with the promoted replica some 100 ms earlier, before the switch is done)."""
        sentinel = Sentinel([("127.0.0.1", self.sentinel_port)], socket_timeout=5)
        return int(sentinel.discover_master(SERVICE)[1])

    def failover(self) -> None:
        self.client(self.sentinel_port).execute_command("SENTINEL", "FAILOVER", SERVICE)

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _server(self, binary: str, name: str, port: int, *extra: str) -> None:
        folder = self.workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        self._spawn([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                     "--appendonly", "no", "--dir", str(folder),
                     # a replica's full sync at once, not after the 5 s wait for others
                     "--repl-diskless-sync-delay", "0", *extra], name)  # fmt: skip

    def _spawn(self, command: list[str], name: str) -> None:
        log = (self.workdir / f"{name}.log").open("ab")
        self.processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
        log.close()

    def _link_status(self, port: int) -> str:
        try:
            return str(self.client(port).info("replication").get("master_link_status", ""))
        except redis.RedisError:
            return ""

    def _quicken_sentinel(self) -> None:
        """Sentinel's clocks at a tenth of their defaults, so a test's failover takes a second
        or two, not ten: INFO every 1 s (the replica's link), and the old master reconfigured
        as a replica after 4 publish periods (8 s by default, here 0.8 s). SENTINEL DEBUG is
        Redis >= 7.0's; an older Sentinel keeps its own clocks (slower, the same failover)."""
        with contextlib.suppress(redis.ResponseError):
            self.client(self.sentinel_port).execute_command(
                "SENTINEL", "DEBUG", "info-period", 1000, "publish-period", 200, "ping-period", 100
            )

    def _sentinel_up(self) -> bool:
        try:
            return bool(self.client(self.sentinel_port).ping())
        except redis.RedisError:
            return False

    def _replica_known(self) -> bool:
        try:
            replicas = self.client(self.sentinel_port).sentinel_slaves(SERVICE)
        except redis.RedisError:
            return False
        return any(
            r["port"] == self.replica_port and not r.get("is_disconnected") for r in replicas
        )

    def _wait(self, predicate: object, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not predicate():  # type: ignore[operator]
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"{what} did not come up within {START_TIMEOUT_S:g} s")
            time.sleep(0.1)
