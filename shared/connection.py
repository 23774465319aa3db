"""The Redis connection every cosyq process makes from settings, and what its errors mean.

`redis://`, `rediss://` (TLS) and `unix://` URLs work, with an ACL user and password in the URL
(`rediss://alice:secret@host:6380/0`). The client works in bytes, as RQ requires.

redis-py raises a wrong password (`AuthenticationError`) as a `ConnectionError`, and a TLS
certificate that does not verify as a plain `ConnectionError`; both are settings to fix, not an
outage to wait out. `misconfiguration()` tells them apart; only a refused or reset connection
or a timeout is an outage.
"""

from __future__ import annotations

import os
import ssl
from typing import Any
from urllib.parse import urlsplit

import redis
from redis.exceptions import AuthorizationError, NoPermissionError

from shared import keys
from shared.errors import SettingsError, TransientError
from shared.settings import Settings

REDIS_OUTAGE = (redis.ConnectionError, redis.TimeoutError)  # minus misconfiguration(): retry
_PASSING_SSL_ERRORS = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)


def redis_connection(settings: Settings) -> redis.Redis:
    """A client for settings.redis_url; connects lazily on first command."""
    options: dict[str, Any] = {
        "socket_connect_timeout": settings.redis_connect_timeout_s,
        "socket_timeout": settings.redis_socket_timeout_s,
        "health_check_interval": settings.redis_health_check_interval_s,
    }
    if urlsplit(settings.redis_url).scheme == "rediss" and settings.redis_ssl_ca_certs:
        options["ssl_ca_certs"] = str(settings.redis_ssl_ca_certs)
    return redis.Redis.from_url(settings.redis_url, **options)


def misconfiguration(error: BaseException) -> str | None:
    """The cause, when a Redis error means the settings are wrong; None for anything else."""
    if isinstance(error, redis.AuthenticationError):
        return f"authentication failed: {_text(error)}"
    if isinstance(error, AuthorizationError | NoPermissionError):
        return f"permission denied (ACL): {_text(error)}"
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
