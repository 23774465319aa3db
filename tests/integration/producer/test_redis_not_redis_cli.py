"""Every entry point named at something that is no Redis ends with one line and exit 2: a port
whose server takes each connection and closes it unanswered (PostgreSQL's, a TLS-only Redis
named by redis://), and a redis+sentinel:// URL naming a plain Redis with a password. Both were
waited out for ever as Redis away (`waiting_for_redis`, `webhook_outbox_unreachable`)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doubles.redis_servers import SecuredRedis, free_port, secured_redis

BIN = Path(sys.executable).parent
PASSWORD = "pw-8RW"
COMMANDS = {
    "cosyq status": ["cosyq", "status"],
    "cosyq submit": ["cosyq", "submit", "jobs.jsonl"],
    "cosyq serve": ["cosyq", "serve", "--port", str(free_port())],
    "cosyq webhooks run": ["cosyq", "webhooks", "run"],
    "cosyq-worker run": ["cosyq-worker", "run"],
    "cosyq-worker pool": ["cosyq-worker", "pool"],
}


@pytest.fixture
def closing_port() -> Iterator[int]:
    """A server of our own that accepts each connection and closes it at once."""
    listener = socket.create_server(("127.0.0.1", 0))

    def close_each() -> None:
        with contextlib.suppress(OSError):
            while True:
                listener.accept()[0].close()

    threading.Thread(target=close_each, daemon=True).start()
    yield listener.getsockname()[1]
    listener.close()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredRedis]:
    with secured_redis(tmp_path_factory.mktemp("secured")) as server:
        yield server


def _run(command: str, url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYQ_")}
    env |= {"COSYQ_REDIS_URL": url, "COSYQ_REDIS_SILENT_CLOSE_S": "0.5"}
    env |= {"COSYQ_STORAGE_URL": (cwd / "out").as_uri()}
    env |= {"COSYQ_WEBHOOK_SECRET": "whsec_d2hzZWMtc2VjcmV0LTNaWg=="}
    (cwd / "jobs.jsonl").write_text('{"text": "hello"}\n')
    argv = COMMANDS[command]
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        check=False,
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,  # before the fix every one but status and submit ran until killed
    )


def _refused_in_one_line(done: subprocess.CompletedProcess[str]) -> str:
    printed = done.stdout + done.stderr
    assert done.returncode == 2, printed
    assert "Traceback" not in printed and PASSWORD not in printed, printed
    lines = [line for line in done.stderr.splitlines() if "COSYQ_REDIS_URL" in line]
    assert len(lines) == 1, printed
    return lines[0]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_port_that_closes_each_connection_is_no_redis(
    command: str, closing_port: int, tmp_path: Path
) -> None:
    done = _run(command, f"redis://:{PASSWORD}@127.0.0.1:{closing_port}/0", tmp_path)
    line = _refused_in_one_line(done)
    assert f"COSYQ_REDIS_URL (redis://:***@127.0.0.1:{closing_port}/0): " in line
    assert "closed it without a reply: not a Redis" in line


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_sentinel_url_naming_a_redis_with_a_password_is_refused(
    command: str, secured: SecuredRedis, tmp_path: Path
) -> None:
    url = f"redis+sentinel://:{PASSWORD}@127.0.0.1:{secured.port}/mymaster/0"
    line = _refused_in_one_line(_run(command, url, tmp_path))
    assert "a redis+sentinel:// host asks for a password: not a Sentinel" in line
