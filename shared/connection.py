"""The Redis connection every cosyq process makes from settings, and what its errors mean.

`redis://`, `rediss://` (TLS) and `unix://` URLs work, with an ACL user and password in the URL
(`rediss://alice:secret@host:6380/0`), and so does Redis Sentinel
(`redis+sentinel://alice:secret@s1:26379,s2:26379/mymaster/0`, shared/sentinel.py): the client
asks the sentinels for the master whenever it (re)connects, and `follow_master` moves it after
a failover. The client works in bytes, as RQ requires.

redis-py raises a wrong password (`AuthenticationError`) as a `ConnectionError`, and a TLS
certificate that does not verify as a plain `ConnectionError`; both are settings to fix, not an
outage to wait out, as is a reply in another protocol (the URL names another service's port)
and a database number the server does not have (`/99`: a ResponseError on connect) or a
redis+sentinel:// URL naming a plain Redis (which answers SENTINEL with "unknown command", or
NOAUTH with a password: redis-py took that for a sentinel down, and waited for ever), and a
server that takes every connection at start-up and closes it unanswered (shared/first_contact.py).
`misconfiguration()` tells them apart; only a refused or reset connection or a timeout is an
outage.
"""

from __future__ import annotations

import os
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.connection import SENTINEL
from redis.exceptions import AuthorizationError, InvalidResponse, NoPermissionError, ResponseError
from redis.sentinel import (
    MasterNotFoundError,
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
)

from shared import keys
from shared.errors import SettingsError, TransientError
from shared.first_contact import (
    AsyncFirstContactConnection,
    FirstContactConnection,
    PlainTextRedisError,
    SilentServerError,
    answers_in_plain_text,
)
from shared.sentinel import SENTINEL_SCHEME, SentinelAddress, parse_sentinel_url
from shared.settings import Settings

REDIS_OUTAGE = (redis.ConnectionError, redis.TimeoutError)  # minus misconfiguration(): retry
_PASSING_SSL_ERRORS = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)


def redis_connection(settings: Settings, *, read_timeout_s: float | None = None) -> redis.Redis:
    """A client for settings.redis_url; connects lazily on first command.

    `read_timeout_s` overrides COSYQ_REDIS_SOCKET_TIMEOUT_S for a client that must never wait
    long (a metrics scrape).
    """
    options = _client_options(settings, read_timeout_s)
    if urlsplit(settings.redis_url).scheme == SENTINEL_SCHEME:
        sentinel, address = _sentinels(_Sentinel, settings, options)
        return sentinel.master_for(
            address.service_name,
            db=address.db,
            username=address.username,
            password=address.password,
            connection_class=_SentinelConnection,
        )
    if urlsplit(settings.redis_url).scheme == "rediss":
        options["connection_class"] = _TlsConnection
    if urlsplit(settings.redis_url).scheme == "redis":  # shared/first_contact.py
        options["connection_class"] = FirstContactConnection
        options["silent_close_s"] = settings.redis_silent_close_s
    return redis.Redis.from_url(settings.redis_url, **options)


def async_redis_connection(settings: Settings, *, max_connections: int) -> aioredis.Redis:
    """The asyncio twin of `redis_connection` (same URL forms and timeouts), for the HTTP front;
    its pool holds at most `max_connections` (one more is an error, not a wait)."""
    options = _client_options(settings, None)
    if urlsplit(settings.redis_url).scheme == SENTINEL_SCHEME:
        sentinel, address = _sentinels(_AsyncSentinel, settings, options)
        return sentinel.master_for(
            address.service_name,
            db=address.db,
            username=address.username,
            password=address.password,
            max_connections=max_connections,
        )
    if urlsplit(settings.redis_url).scheme == "redis":  # its first reply marks the process
        options["connection_class"] = AsyncFirstContactConnection
    return aioredis.Redis.from_url(settings.redis_url, max_connections=max_connections, **options)


def _client_options(settings: Settings, read_timeout_s: float | None) -> dict[str, Any]:
    """Timeouts and TLS options for either client, from settings."""
    options: dict[str, Any] = {
        "socket_connect_timeout": settings.redis_connect_timeout_s,
        "socket_timeout": read_timeout_s or settings.redis_socket_timeout_s,
        "health_check_interval": settings.redis_health_check_interval_s,
    }
    if urlsplit(settings.redis_url).scheme == "rediss" and settings.redis_ssl_ca_certs:
        options["ssl_ca_certs"] = str(settings.redis_ssl_ca_certs)
    return options


def _sentinels(
    kind: type[Sentinel] | type[AsyncSentinel], settings: Settings, options: dict[str, Any]
) -> tuple[Any, SentinelAddress]:
    """The URL's sentinels (sync or asyncio) and its parsed address; the client asks them for
    the master on every (re)connect. A dead sentinel is skipped, not waited on."""
    address = parse_sentinel_url(settings.redis_url)
    timeout = settings.redis_connect_timeout_s
    sentinel = kind(
        list(address.sentinels),
        sentinel_kwargs={"socket_connect_timeout": timeout, "socket_timeout": timeout},
        **options,
    )
    return sentinel, address


class SentinelAsksPasswordError(ResponseError):
    """A redis+sentinel:// host asked for a password: a plain Redis with requirepass, most
    likely (a Sentinel is asked without one). redis-py's discovery takes its NOAUTH for a
    sentinel that is down, so the master was "not found" for ever."""


_SENTINEL_ASKS_PASSWORD = "a redis+sentinel:// host asks for a password"


class _Sentinel(Sentinel):
    """redis-py's Sentinel, saying why no master was found when a host asked for a password."""

    def discover_master(self, service_name: str) -> Any:
        try:
            return super().discover_master(service_name)
        except MasterNotFoundError:
            for client in self.sentinels:
                try:
                    client.ping()
                except redis.AuthenticationError as e:
                    raise SentinelAsksPasswordError(_SENTINEL_ASKS_PASSWORD) from e
                except redis.RedisError:
                    continue  # down, or answers: not what hid the master
            raise


class _AsyncSentinel(AsyncSentinel):
    """The asyncio twin of `_Sentinel`."""

    async def discover_master(self, service_name: str) -> Any:
        try:
            return await super().discover_master(service_name)
        except MasterNotFoundError:
            for client in self.sentinels:
                try:
                    await client.ping()
                except redis.AuthenticationError as e:
                    raise SentinelAsksPasswordError(_SENTINEL_ASKS_PASSWORD) from e
                except redis.RedisError:
                    continue
            raise


class _TlsConnection(redis.SSLConnection):
    """redis-py's TLS connection with its handshake bounded by the connect timeout.

    redis-py gives the socket its read timeout (COSYQ_REDIS_SOCKET_TIMEOUT_S, unset: none)
    before the handshake, so a rediss:// URL naming a plain-text Redis, which never answers a
    ClientHello, waited for ever with nothing said. The asyncio client bounds its whole
    connect, handshake included, by the connect timeout already.
    """

    def _wrap_socket_with_ssl(self, sock: socket.socket) -> Any:
        sock.settimeout(self.socket_connect_timeout)
        try:
            wrapped = super()._wrap_socket_with_ssl(sock)
        except TimeoutError as e:
            if answers_in_plain_text(self.host, self.port, self.socket_connect_timeout):
                raise PlainTextRedisError(
                    f"{self.host}:{self.port} answers in plain text, not TLS: a plain Redis"
                    " (then use redis://), or its TLS port is another"
                ) from e
            raise redis.TimeoutError(
                f"no TLS handshake within {self.socket_connect_timeout} s"
                " (a rediss:// URL needs a server that speaks TLS)"
            ) from e
        wrapped.settimeout(self.socket_timeout)
        return wrapped


class _SentinelConnection(SentinelManagedConnection):
    """redis-py's Sentinel connection, closed when a read fails, as a plain connection is.

    redis-py 8 defaults `disconnect_on_error` to False for Sentinel connections only, so a read
    cut short (a socket timeout, or RQ's StopRequested raised from a signal handler during a
    blocking dequeue) leaves the connection in the pool with its reply still due: the next
    command reads that old reply, or waits behind the server's blocked BLMOVE forever (seen
    here as a warm shutdown that never ended).
    """

    def read_response(
        self,
        disable_decoding: Any = False,
        *,
        timeout: float | object = SENTINEL,
        disconnect_on_error: bool | None = True,
        push_request: bool | None = False,
    ) -> Any:
        return super().read_response(
            disable_decoding=disable_decoding,
            timeout=timeout,
            disconnect_on_error=disconnect_on_error,
            push_request=push_request,
        )


def follow_master(connection: redis.Redis) -> bool:
    """Sentinel only: ask where the master is now; after a failover, leave the old one.

    Why: a pooled connection stays on the old master, and the old master keeps accepting
    writes (all lost when it is demoted) for some seconds after the promotion, until Sentinel
    reconfigures it (measured here: about 10 s). Long-lived processes call this every few
    seconds, and the producer before each submit. When the address changed, redis-py closes
    the idle connections and drops each busy one as it is returned (never under a running
    command: closing a socket another thread reads is not safe). Returns True when the master
    moved; raises redis.ConnectionError (MasterNotFoundError) while no sentinel answers.
    """
    pool = connection.connection_pool
    if not isinstance(pool, SentinelConnectionPool):
        return False
    before = pool.master_address
    after = pool.get_master_address()
    return before is not None and after != before


def misconfiguration(error: BaseException) -> str | None:
    """The cause, when a Redis error means the settings are wrong; None for anything else."""
    if isinstance(error, redis.AuthenticationError):
        return f"authentication failed: {_text(error)}"
    if isinstance(error, AuthorizationError | NoPermissionError):
        return f"permission denied (ACL): {_text(error)}"
    if isinstance(error, InvalidResponse):  # its text holds the other server's raw bytes
        return "the server's reply is not in Redis's protocol (another service on that port?)"
    if isinstance(error, SilentServerError | PlainTextRedisError):
        return str(error)
    if isinstance(error, ResponseError) and "DB index is out of range" in str(error):
        return "the database number after the host is past the server's `databases` setting"
    if isinstance(error, ResponseError) and "unknown command 'SENTINEL'" in str(error):
        return "a redis+sentinel:// host is not a Sentinel (a plain Redis? then use redis://)"
    if isinstance(error, SentinelAsksPasswordError):
        return (
            "a redis+sentinel:// host asks for a password: not a Sentinel (a plain Redis with"
            " requirepass? then use redis://); sentinels are asked without one"
        )
    if not isinstance(error, redis.ConnectionError):
        return None
    cause = _ssl_cause(error)
    if isinstance(cause, ssl.SSLCertVerificationError):
        return f"TLS certificate did not verify: {cause.verify_message or cause.reason}"
    if cause is not None:
        return f"TLS handshake failed: {cause.reason or cause}"
    return None


def is_outage(error: BaseException) -> bool:
    """An error worth waiting out: Redis unreachable, not Redis refusing our settings."""
    return isinstance(error, REDIS_OUTAGE) and misconfiguration(error) is None


def settings_error(error: BaseException, settings: Settings) -> SettingsError | None:
    """The one-line SettingsError for a misconfiguration, naming the URL (password masked)."""
    cause = misconfiguration(error)
    if cause is None:
        return None
    return SettingsError(f"COSYQ_REDIS_URL ({settings.redacted_redis_url()}): {cause}")


def probe_redis(connection: redis.Redis) -> None:
    """PING, then read and write in both key spaces (keys that never exist): catches NOPERM.

    Raises redis-py's own errors; `check_redis` and the worker's start-up interpret them.
    """
    probe = f"probe:{os.urandom(6).hex()}"
    connection.ping()
    connection.exists(f"rq:{probe}", keys.PREFIX + probe)
    connection.delete(f"rq:{probe}", keys.PREFIX + probe)


def check_redis(connection: redis.Redis, settings: Settings) -> None:
    """Probe once so a wrong URL, password or ACL fails at start-up with a message, not mid-job.

    Bad credentials, missing permissions and TLS failures are a SettingsError (fix the
    settings); an unreachable server is a TransientError.
    """
    try:
        probe_redis(connection)
    except redis.RedisError as e:
        problem = settings_error(e, settings)
        if problem is not None:
            raise problem from e
        if isinstance(e, REDIS_OUTAGE):
            raise TransientError(
                f"cannot reach Redis at {settings.redacted_redis_url()}: {_text(e)}"
            ) from e
        raise


def _ssl_cause(error: BaseException) -> ssl.SSLError | None:
    """The SSL error redis-py wrapped (it raises ConnectionError inside `except OSError`)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLError) and not isinstance(current, _PASSING_SSL_ERRORS):
            return current
        current = current.__cause__ or current.__context__
    return None


def _text(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__
