"""The Redis connection every cosyq process makes from settings.

`redis://`, `rediss://` (TLS) and `unix://` URLs work, with an ACL user and password in the URL
(`rediss://alice:secret@host:6380/0`). The client works in bytes, as RQ requires.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
from redis.exceptions import AuthorizationError, NoPermissionError

from shared.errors import SettingsError, TransientError
from shared.settings import Settings


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
