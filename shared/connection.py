"""The Redis connection every cosyq process makes from settings.

`redis://`, `rediss://` (TLS) and `unix://` URLs work, with an ACL user and password in the URL
(`rediss://alice:secret@host:6380/0`), and so does Redis Sentinel
(`redis+sentinel://alice:secret@s1:26379,s2:26379/mymaster/0`, shared/sentinel.py): the client
asks the sentinels for the master whenever it (re)connects, so after a failover the next
command reaches the new master. The client works in bytes, as RQ requires.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
from redis.connection import SENTINEL
from redis.exceptions import AuthorizationError, NoPermissionError
from redis.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection

from shared.errors import SettingsError, TransientError
from shared.sentinel import SENTINEL_SCHEME, parse_sentinel_url
from shared.settings import Settings


def redis_connection(settings: Settings, *, read_timeout_s: float | None = None) -> redis.Redis:
    """A client for settings.redis_url; connects lazily on first command.

    `read_timeout_s` overrides COSYQ_REDIS_SOCKET_TIMEOUT_S for a client that must never wait
    long (a metrics scrape).
    """
    options: dict[str, Any] = {
        "socket_connect_timeout": settings.redis_connect_timeout_s,
        "socket_timeout": read_timeout_s or settings.redis_socket_timeout_s,
        "health_check_interval": settings.redis_health_check_interval_s,
    }
    scheme = urlsplit(settings.redis_url).scheme
    if scheme == SENTINEL_SCHEME:
        return _sentinel_master(settings, options)
    if scheme == "rediss" and settings.redis_ssl_ca_certs:
        options["ssl_ca_certs"] = str(settings.redis_ssl_ca_certs)
    return redis.Redis.from_url(settings.redis_url, **options)


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


def _sentinel_master(settings: Settings, options: dict[str, Any]) -> redis.Redis:
    """The master of the URL's service, found through its sentinels on every (re)connect."""
    address = parse_sentinel_url(settings.redis_url)
    timeout = settings.redis_connect_timeout_s  # a dead sentinel is skipped, not waited on
    sentinel = Sentinel(
        list(address.sentinels),
        sentinel_kwargs={"socket_connect_timeout": timeout, "socket_timeout": timeout},
        **options,
    )
    return sentinel.master_for(
        address.service_name,
        db=address.db,
        username=address.username,
        password=address.password,
        connection_class=_SentinelConnection,
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


def check_redis(connection: redis.Redis, settings: Settings) -> None:
    """PING once so a wrong URL or password fails at start-up with a message, not mid-job.

    Bad credentials are a SettingsError (fix the URL); an unreachable server is transient.
    """
    where = settings.redacted_redis_url()
    try:
        connection.ping()
    except (redis.AuthenticationError, AuthorizationError, NoPermissionError) as e:
        raise SettingsError(f"COSYQ_REDIS_URL ({where}): not allowed: {e}") from e
    except (redis.ConnectionError, redis.TimeoutError) as e:
        raise TransientError(f"cannot reach Redis at {where}: {e}") from e
