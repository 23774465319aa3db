"""A server that takes each connection and closes it without a reply (another service's port,
a TLS-only Redis named by redis://) is refused at start-up as no Redis; what an outage looks
like (refused, a reply such as maxclients', a close after a first reply) is still waited out.
Tiny socket servers of the test's own, not whatever listens on 5432 here."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from shared import first_contact
from shared.connection import (
    async_redis_connection,
    check_redis,
    is_outage,
    misconfiguration,
    redis_connection,
)
from shared.errors import SettingsError, TransientError
from shared.first_contact import SilentServerError, silent_close_hint
from shared.settings import load_settings
from tests.doubles.redis_servers import free_port, tls_redis

WINDOW_S = 0.3


class ClosingServer:
    """Accepts each connection and ends it at once: FIN, or RST with `reset`; after
    `refuse_after` connections it stops listening (a server going away: refused)."""

    def __init__(self, *, reset: bool = False, refuse_after: int | None = None) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self.reset, self.refuse_after = reset, refuse_after
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                peer, _ = self.listener.accept()
                self.accepted += 1
                if self.reset:
                    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                peer.close()
                if self.refuse_after is not None and self.accepted >= self.refuse_after:
                    self.listener.close()
                    return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture(autouse=True)
def first_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test is a process that has had no reply from Redis yet."""
    monkeypatch.setattr(first_contact.FIRST_CONTACT, "answered", False)


@pytest.fixture
def closing() -> Iterator[ClosingServer]:
    server = ClosingServer()
    yield server
    server.close()


def _check(port: int, window_s: float = WINDOW_S, scheme: str = "redis") -> None:
    settings = load_settings(
        env_file=None,
        redis_url=f"{scheme}://:pw-4KQ@127.0.0.1:{port}/0",
        redis_silent_close_s=window_s,
    )
    connection = redis_connection(settings)
    try:
        check_redis(connection, settings)
    finally:
        connection.close()


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
def test_a_server_that_closes_every_connection_unanswered_is_no_redis(reset: bool) -> None:
    server = ClosingServer(reset=reset)
    try:
        with pytest.raises(SettingsError) as caught:
            _check(server.port)
    finally:
        server.close()
    message = str(caught.value)
    assert message.startswith(f"COSYQ_REDIS_URL (redis://:***@127.0.0.1:{server.port}/0): ")
    assert f"127.0.0.1:{server.port} took each of 3 connections and closed it" in message
    assert "TLS-only Redis (use rediss://)" in message and "pw-4KQ" not in message
    assert server.accepted >= 3
    error = caught.value.__cause__
    assert isinstance(error, SilentServerError)
    assert misconfiguration(error) is not None and not is_outage(error)


def test_a_tls_only_redis_named_by_redis_url_is_refused(tmp_path: Path) -> None:
    with tls_redis(tmp_path) as (port, _), pytest.raises(SettingsError) as caught:
        _check(port)
    assert "or a TLS-only Redis (use rediss://)" in str(caught.value)


def test_a_server_that_goes_away_mid_streak_is_an_outage() -> None:
    # one silent close, then the port refuses: Redis stopping, not another service
    server = ClosingServer(refuse_after=1)
    with pytest.raises(TransientError, match="Connection refused"):
        _check(server.port)
    assert server.accepted == 1


def test_after_a_first_reply_a_silent_close_is_an_outage(closing: ClosingServer) -> None:
    first_contact.FIRST_CONTACT.answered = True  # Redis answered this process before
    with pytest.raises(TransientError, match="cannot reach Redis"):
        _check(closing.port)
    assert closing.accepted >= 1


def test_a_window_of_zero_waits_every_silent_close_out(closing: ClosingServer) -> None:
    with pytest.raises(TransientError, match="cannot reach Redis"):
        _check(closing.port, window_s=0)


def test_the_first_reply_marks_the_process(redis_url: str) -> None:
    settings = load_settings(env_file=None, redis_url=redis_url)
    connection = redis_connection(settings)
    check_redis(connection, settings)
    connection.close()
    assert first_contact.FIRST_CONTACT.answered


def test_the_asyncio_clients_first_reply_marks_the_process(redis_url: str) -> None:
    """The front's asyncio client (its /readyz, its waits): a front process that served only
    those applied the start-up rule to its synchronous client's first connection."""
    settings = load_settings(env_file=None, redis_url=redis_url)
    client = async_redis_connection(settings, max_connections=2)

    async def ping() -> None:
        await client.ping()
        await client.aclose()

    asyncio.run(ping())
    assert first_contact.FIRST_CONTACT.answered


def test_a_running_front_names_a_silent_close_before_any_reply(closing: ClosingServer) -> None:
    """Started while Redis was away, then a service on its port: the front's asyncio client
    waits nothing out (its /readyz answers at once) but says what the close may mean."""
    settings = load_settings(env_file=None, redis_url=f"redis://127.0.0.1:{closing.port}/0")
    client = async_redis_connection(settings, max_connections=2)

    async def ping() -> redis.RedisError:
        try:
            await client.ping()
        except redis.RedisError as e:
            return e
        finally:
            await client.aclose()
        raise AssertionError("a server that closes every connection answered")

    error = asyncio.run(ping())
    assert isinstance(error, redis.ConnectionError) and closing.accepted >= 1
    assert silent_close_hint(error).startswith("closed without a reply, and no Redis has")
    assert "use rediss://" in silent_close_hint(error)
    first_contact.FIRST_CONTACT.answered = True  # Redis answered this process before: an outage
    assert silent_close_hint(error) == ""


def test_a_redis_at_maxclients_is_an_outage(tmp_path: Path) -> None:
    port = free_port()
    args = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    args += ["--appendonly", "no", "--maxclients", "1", "--dir", str(tmp_path)]
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL)
    try:
        holder = redis.Redis(port=port)
        deadline = time.monotonic() + 30
        while True:
            try:
                holder.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.1)
        with pytest.raises(TransientError, match="max number of clients reached"):
            _check(port)
        holder.close()
    finally:
        server.terminate()
        server.wait(timeout=30)
