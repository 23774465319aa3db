"""Redis connections from settings: ACL users and passwords in the URL, rediss:// (TLS), and
which errors are settings to fix (never waited out) and which are an outage (waited out)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from shared.connection import check_redis, is_outage, misconfiguration, redis_connection
from shared.errors import SettingsError, TransientError
from shared.settings import load_settings
from tests.doubles.redis_servers import ACL_USERS, SecuredRedis, secured_redis, tls_redis
from workers.service.failures import classify


@pytest.fixture
def acl_user(redis_url: str) -> Iterator[tuple[str, str]]:
    admin = redis.Redis.from_url(redis_url)
    admin.execute_command("ACL", "SETUSER", "alice", "on", ">s3cret pass", "~*", "&*", "+@all")
    yield "alice", "s3cret pass"
    admin.execute_command("ACL", "DELUSER", "alice")
    admin.close()


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredRedis]:
    with secured_redis(tmp_path) as server:
        yield server


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    with tls_redis(tmp_path) as server:
        yield server


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def refusal(url: str, **settings: object) -> SettingsError:
    loaded = load_settings(env_file=None, redis_url=url, **settings)
    with pytest.raises(SettingsError) as caught:
        check_redis(redis_connection(loaded), loaded)
    assert isinstance(caught.value.__cause__, redis.RedisError)
    assert misconfiguration(caught.value.__cause__) is not None
    assert not is_outage(caught.value.__cause__)
    return caught.value


def test_acl_user_and_password_in_the_url(redis_url: str, acl_user: tuple[str, str]) -> None:
    url = f"redis://alice:s3cret%20pass@127.0.0.1:{port_of(redis_url)}/3"
    settings = load_settings(env_file=None, redis_url=url)
    connection = redis_connection(settings)
    check_redis(connection, settings)
    assert connection.acl_whoami() == "alice"
    assert connection.connection_pool.connection_kwargs["db"] == 3
    connection.close()


def test_wrong_password_is_a_settings_error_without_the_password(
    redis_url: str, acl_user: tuple[str, str]
) -> None:
    error = refusal(f"redis://alice:wrong@127.0.0.1:{port_of(redis_url)}/0")
    assert "redis://alice:***@127.0.0.1" in str(error)
    assert "wrong" not in str(error)


def test_requirepass_server_refuses_each_bad_credential(secured: SecuredRedis) -> None:
    password, _ = ACL_USERS["alice"]
    for url, cause in (
        (secured.url(password="not it"), "authentication failed: invalid username-password"),
        (secured.url(), "authentication failed: Authentication required"),
        (secured.url("nobody", "whatever"), "authentication failed: invalid username-password"),
        (secured.url("alice", "s3cret"), "authentication failed: invalid username-password"),
    ):
        error = refusal(url)
        assert str(error).startswith("COSYQ_REDIS_URL (redis://"), error
        assert cause in str(error)
        assert "not it" not in str(error) and "whatever" not in str(error)
    settings = load_settings(env_file=None, redis_url=secured.url("alice", password))
    check_redis(redis_connection(settings), settings)


def test_a_user_without_write_permission_is_refused_at_the_check(secured: SecuredRedis) -> None:
    password, _ = ACL_USERS["reader"]
    error = refusal(secured.url("reader", password))
    assert "permission denied (ACL)" in str(error) and "redis://reader:***@" in str(error)


def test_unreachable_redis_is_transient() -> None:
    settings = load_settings(env_file=None, redis_url="redis://127.0.0.1:9/0")
    with pytest.raises(TransientError, match=r"cannot reach Redis at redis://127\.0\.0\.1:9/0"):
        check_redis(redis_connection(settings), settings)
    assert is_outage(redis.ConnectionError("Connection reset by peer"))
    assert is_outage(redis.TimeoutError("Timeout reading from socket"))


def test_rediss_url_with_password_and_private_ca(tls_server: tuple[int, Path]) -> None:
    port, cert = tls_server
    settings = load_settings(
        env_file=None,
        redis_url=f"rediss://default:tlspass@127.0.0.1:{port}/0",
        redis_ssl_ca_certs=cert,
    )
    connection = redis_connection(settings)
    check_redis(connection, settings)
    connection.set("k", b"v")
    assert connection.get("k") == b"v"
    assert isinstance(connection.connection_pool.get_connection(), redis.SSLConnection)
    connection.close()


def test_a_rediss_url_naming_a_plain_text_server_fails_in_bounded_time(redis_url: str) -> None:
    # A plain-text Redis never answers a ClientHello; the handshake used to wait for ever.
    settings = load_settings(
        env_file=None,
        redis_url=f"rediss://default:plainpass@127.0.0.1:{port_of(redis_url)}/0",
        redis_connect_timeout_s=0.5,
    )
    outcome: list[BaseException] = []

    def probe() -> None:
        try:
            check_redis(redis_connection(settings), settings)
        except Exception as e:  # the test reads it below
            outcome.append(e)

    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    prober.join(timeout=60)
    assert not prober.is_alive(), "the TLS handshake with a plain-text Redis was never bounded"
    # and it is no outage: the server answers a plain PING as Redis (it was waited out for ever)
    assert len(outcome) == 1 and isinstance(outcome[0], SettingsError)
    port = port_of(redis_url)
    assert f"127.0.0.1:{port} answers in plain text, not TLS: a plain Redis" in str(outcome[0])
    assert "plainpass" not in str(outcome[0])


def test_a_tls_handshake_that_times_out_on_a_mute_server_is_an_outage() -> None:
    # a server that takes the connection and says nothing (a Redis busy with a script) stays
    # an outage: only a plain-text Redis's reply to PING makes the timeout a settings error
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []

    def hold() -> None:
        with contextlib.suppress(OSError):
            while True:
                held.append(listener.accept()[0])

    threading.Thread(target=hold, daemon=True).start()
    settings = load_settings(
        env_file=None,
        redis_url=f"rediss://127.0.0.1:{listener.getsockname()[1]}/0",
        redis_connect_timeout_s=0.3,
    )
    try:
        with pytest.raises(TransientError, match="a rediss:// URL needs a server that speaks TLS"):
            check_redis(redis_connection(settings), settings)
    finally:
        listener.close()
        for peer in held:
            peer.close()


def test_a_url_naming_another_services_port_is_a_settings_error_without_its_reply() -> None:
    # NATS, say, greets every client with a line of its own protocol
    greeting = b'INFO {"server_id":"NOTREDIS","proto":1}\r\n'
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    open_sockets: list[socket.socket] = []

    def greet() -> None:
        with contextlib.suppress(OSError):
            while True:
                peer, _ = listener.accept()
                open_sockets.append(peer)
                peer.sendall(greeting)

    threading.Thread(target=greet, daemon=True).start()
    try:
        error = refusal(f"redis://:pw@127.0.0.1:{port}/0")
    finally:
        listener.close()
        for peer in open_sockets:
            peer.close()
    assert "not in Redis's protocol (another service on that port?)" in str(error)
    assert "NOTREDIS" not in str(error) and "pw" not in str(error).replace("***", "")


def test_a_certificate_that_does_not_verify_is_a_settings_error(
    tls_server: tuple[int, Path],
) -> None:
    port, _ = tls_server
    error = refusal(f"rediss://default:tlspass@127.0.0.1:{port}/0")  # no private CA given
    assert f"COSYQ_REDIS_URL (rediss://default:***@127.0.0.1:{port}/0)" in str(error)
    assert "TLS certificate did not verify" in str(error) and "tlspass" not in str(error)


def test_a_job_that_meets_a_redis_refusal_is_not_retried_as_transient() -> None:
    for error in (
        redis.AuthenticationError("invalid username-password pair"),
        redis.exceptions.NoPermissionError("User reader has no permissions to run 'set'"),
    ):
        failure = classify(error)
        assert failure.kind == "internal" and not failure.retryable
        assert failure.message.startswith("Redis refused this worker: ")
    assert classify(redis.ConnectionError("Connection refused")).kind == "transient"


def test_a_database_number_the_server_lacks_is_a_settings_error(redis_url: str) -> None:
    # redis-server has 16 databases unless told otherwise: /99 is refused at SELECT
    url = redis_url.rsplit("/", 1)[0] + "/99"
    error = refusal(url)
    assert "the database number after the host is past the server's `databases`" in str(error)


def test_a_sentinel_url_naming_a_plain_redis_is_a_settings_error(redis_url: str) -> None:
    error = refusal(f"redis+sentinel://127.0.0.1:{port_of(redis_url)}/mymaster/0")
    assert "a redis+sentinel:// host is not a Sentinel (a plain Redis? then use redis://)" in str(
        error
    )


def test_a_sentinel_url_naming_a_plain_redis_with_a_password_is_a_settings_error(
    secured: SecuredRedis,
) -> None:
    # NOAUTH: redis-py's discovery took it for a sentinel down ("No master found", waited out)
    error = refusal(f"redis+sentinel://127.0.0.1:{secured.port}/mymaster/0")
    assert "a redis+sentinel:// host asks for a password: not a Sentinel" in str(error)
