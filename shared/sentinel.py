"""Redis Sentinel URLs: `redis+sentinel://[user:pass@]host:port[,host:port]/service_name[/db]`.

Why a URL of our own: redis-py's `from_url` has no Sentinel form, and one COSYQ_REDIS_URL must
describe the whole connection for the producer, the workers, the pool and the HTTP front. The
sentinels are listed in the host part (port 26379 when omitted); the credentials and the
database are the master's (the sentinels are asked without a password). Parsing only, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

SENTINEL_SCHEME = "redis+sentinel"
DEFAULT_SENTINEL_PORT = 26379
EXAMPLE = "redis+sentinel://[user:pass@]host:port[,host:port]/service_name[/db]"


@dataclass(frozen=True)
class SentinelAddress:
    """The parts of a Sentinel URL."""

    sentinels: tuple[tuple[str, int], ...]
    service_name: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def parse_sentinel_url(url: str) -> SentinelAddress:
    """Split a Sentinel URL; a malformed one raises ValueError saying which part and why."""
    parts = urlsplit(url)
    if parts.scheme != SENTINEL_SCHEME:
        raise ValueError(f"not a {SENTINEL_SCHEME}:// URL")
    if parts.query or parts.fragment:
        raise ValueError(f"a Sentinel URL takes no ?query or #fragment ({EXAMPLE})")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    username, password = _credentials(userinfo)
    sentinels = tuple(_host_port(item, n) for n, item in enumerate(hosts.split(","), 1))
    segments = parts.path.strip("/").split("/") if parts.path.strip("/") else []
    if not segments or len(segments) > 2 or not segments[0]:
        raise ValueError(f"needs a service name after the hosts ({EXAMPLE})")
    db = 0
    if len(segments) == 2:
        if not segments[1].isdigit():
            raise ValueError(f"the database must be a number (got {segments[1]!r})")
        db = int(segments[1])
    return SentinelAddress(sentinels, unquote(segments[0]), db, username, password)


def _credentials(userinfo: str) -> tuple[str | None, str | None]:
    if not userinfo:
        return None, None
    user, has_password, password = userinfo.partition(":")
    return (unquote(user) or None), (unquote(password) if has_password else None)


def _host_port(item: str, position: int) -> tuple[str, int]:
    """`host:port`, `host` (port 26379) or `[ipv6]:port`. A bad one is named by its position,
    never quoted: with the '@' forgotten, the credentials are in the host list."""
    if not item:
        raise ValueError(f"an empty sentinel address in the host list ({EXAMPLE})")
    if item.startswith("["):
        host, bracket, rest = item[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"bad sentinel address (host {position})")
        port_text = rest[1:]
    else:
        host, _, port_text = item.partition(":")
    if not host:
        raise ValueError(f"a sentinel address without a host (host {position})")
    if not port_text:
        return host, DEFAULT_SENTINEL_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"bad sentinel port (host {position}): 1-65535")
    return host, int(port_text)
