"""Shared fixtures: a private redis-server per test session, never a Redis we did not start."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

REPO_ROOT = Path(__file__).resolve().parents[1]


def find_reference_dir() -> Path | None:
    """The official-format reference set: $COSYQ_REFERENCE_DIR, else ../shared beside the repo."""
    candidates = [os.environ.get("COSYQ_REFERENCE_DIR"), REPO_ROOT.parent / "shared"]
    for candidate in candidates:
        if not candidate:
            continue
        path = Path(candidate)
        for folder in (path, path / "cosyvoice2-reference"):
            if (folder / "config.json").is_file():
                return folder
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server process we own: started on a free port, stopped and restartable."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail(
                "redis-server is not installed (apt install redis-server / brew install redis)"
            )
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """A clean database on our own server (safe to flush: we started it)."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    yield redis_server.url
    client.flushdb()
    client.close()


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """The reference set; CI sets COSYQ_REQUIRE_REFERENCE=1 so a missing set fails, not skips."""
    found = find_reference_dir()
    if found is None:
        reason = "CosyVoice 2 reference set not found: set COSYQ_REFERENCE_DIR to its folder"
        if os.environ.get("COSYQ_REQUIRE_REFERENCE") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return found


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight model in the official layout, written once per session."""
    from workers.model.tiny import write_tiny_model  # noqa: PLC0415 (torch only when used)

    root = tmp_path_factory.mktemp("tiny-model")
    write_tiny_model(root)
    return root


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The real torch engine on the tiny model (cpu, fp32), loaded once per session."""
    from workers.pipeline import build_engine  # noqa: PLC0415

    return build_engine(
        tiny_model_dir, device="cpu", hash_cache_dir=tmp_path_factory.mktemp("hashes")
    )
