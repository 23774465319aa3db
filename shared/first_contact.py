"""A server that takes the TCP connection and closes it without a word: an outage, or no Redis?

A `redis://` URL naming another service's port (PostgreSQL, MySQL/MariaDB, RabbitMQ, MQTT) or a
TLS-only Redis (which needs `rediss://`) accepts the connection and closes it, or resets it,
when redis-py sends its first command: no byte of a reply, so redis-py says "Connection closed
by server" or "Connection reset by peer", which read as Redis away and were waited out for ever
(`waiting_for_redis`). A Redis that is away refuses the connection instead, or times out; one
loading its data answers LOADING, one at `maxclients` answers an error; each is an outage.

The rule: until this process has had one reply from Redis, a connection the server closed
before any reply is tried again, COSYQ_REDIS_SILENT_CLOSE_S spread over `SILENT_CLOSE_TRIES`
tries; when every try in a row was closed so (none refused, timed out or answered),
`SilentServerError` (a settings error: exit 2, one line). After a first reply never: Redis
restarting behind a proxy looks the same and is waited out. COSYQ_REDIS_SILENT_CLOSE_S=0 turns
the rule off. A proxy that takes connections for a Redis that is down (docker-proxy with the
container stopped) looks the same too: a longer COSYQ_REDIS_SILENT_CLOSE_S waits it out longer.

`cosyq serve` applies the rule at start-up (its check before uvicorn starts); once running it
exits on nothing, and a Redis error is a 503 and a /readyz that says why (`silent_close_hint`:
a process that never had a reply and sees a silent close may be named at no Redis, which a
front started while Redis was away, and a service then taking the port, would only ever call
an outage). The front's asyncio client marks the process on its first reply too
(`AsyncFirstContactConnection`): a front process that had served asyncio requests alone
(/readyz; each uvicorn worker of `--workers N` starts unmarked) met its synchronous client's
first connection with the start-up rule, so during an outage behind a proxy a submit waited
COSYQ_REDIS_SILENT_CLOSE_S and was told that Redis is no Redis.

The reverse, a rediss:// URL naming a plain-text Redis, times out its TLS handshake (the Redis
waits for the end of a line), as a Redis busy with a script would: such a timeout is checked
with a plain-text PING, and only a Redis's reply to it makes it `PlainTextRedisError`.
"""

from __future__ import annotations

import re
import socket
import time
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError

SILENT_CLOSE_TRIES = 3  # tries, all closed without a reply, before the server is refused
_CLOSED = "Connection closed by server"


class SilentServerError(RedisError):
    """Every connection this process made was taken and closed without a reply.

    Not a ConnectionError: redis-py would retry it as one, and every caller wait it out."""


class _FirstContact:
    """Whether this process has had a reply from Redis (then every failure is an outage)."""

    answered = False


FIRST_CONTACT = _FirstContact()


class FirstContactConnection(redis.Connection):
    """redis-py's plain TCP connection with the rule above; `silent_close_s` from settings."""

    def __init__(self, *args: Any, silent_close_s: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.silent_close_s = silent_close_s

    def on_connect_check_health(self, check_health: bool = True) -> None:
        try:
            super().on_connect_check_health(check_health=check_health)
        except redis.ConnectionError as e:
            if closed_without_reply(e):
                raise _ClosedSilentlyError(str(e)) from e
            raise
        FIRST_CONTACT.answered = True  # its handshake (CLIENT SETINFO at least) was answered

    def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        started, tries = time.monotonic(), 0
        while True:
            try:
                super().connect_check_health(check_health, retry_socket_connect)
                return
            except redis.ConnectionError as e:
                if not isinstance(e, _ClosedSilentlyError) and not _reset(e):
                    raise  # refused, unreachable, or an answer (maxclients): an outage
                if FIRST_CONTACT.answered or self.silent_close_s <= 0:
                    raise redis.ConnectionError(str(e)) from e  # an outage, as before
                tries += 1
                if (
                    tries >= SILENT_CLOSE_TRIES
                    and time.monotonic() - started >= self.silent_close_s
                ):
                    raise SilentServerError(
                        f"{self.host}:{self.port} took each of {tries} connections and closed it "
                        "without a reply: not a Redis (another service on that port?), or a "
                        "TLS-only Redis (use rediss://)"
                    ) from e
                time.sleep(self.silent_close_s / (SILENT_CLOSE_TRIES - 1))


class AsyncFirstContactConnection(aioredis.Connection):
    """redis-py's asyncio TCP connection whose answered handshake marks the process, as the
    synchronous one's does; it waits out no silent close (a running front's /readyz must
    answer at once: `silent_close_hint` says what such a close may mean)."""

    async def on_connect_check_health(self, check_health: bool = True) -> None:
        await super().on_connect_check_health(check_health=check_health)
        FIRST_CONTACT.answered = True


def silent_close_hint(error: BaseException) -> str:
    """What a Redis error may mean, for a running process's messages: a close before any reply
    while this process has never had one is named as maybe no Redis; "" otherwise."""
    if FIRST_CONTACT.answered or not closed_without_reply(error):
        return ""
    return (
        "closed without a reply, and no Redis has answered this process yet: not a Redis"
        " (another service on that port?), a TLS-only Redis (use rediss://), or a Redis still"
        " starting behind a proxy"
    )


class _ClosedSilentlyError(redis.ConnectionError):
    """Inside `FirstContactConnection` only: the server closed before any reply."""


def closed_without_reply(error: BaseException) -> bool:
    """A connection the server ended (FIN or RST) before redis-py read any reply from it."""
    return _CLOSED in str(error) or _reset(error)


def _reset(error: BaseException) -> bool:
    """A connection reset by the server (after it took it: a refused one is no reset)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionResetError | BrokenPipeError | ConnectionAbortedError):
            return True
        current = current.__cause__ or current.__context__
    return False


class PlainTextRedisError(RedisError):
    """A rediss:// URL names a Redis that answers in plain text: no TLS handshake ever comes.

    Not a TimeoutError: that one is an outage (a Redis busy with a script never answers either),
    and this reply says the port is a plain-text Redis's."""


_RESP_LINE = re.compile(rb"^[+-][A-Za-z]")  # +PONG, -NOAUTH ..., -DENIED ...: Redis's replies


def answers_in_plain_text(host: str, port: int, timeout_s: float | None) -> bool:
    """Whether the server at host:port answers a plain-text PING as a Redis does (after a TLS
    handshake with it timed out). Any failure to say so is False: the timeout stands."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
    except OSError:
        return False
    return bool(_RESP_LINE.match(reply)) and reply.endswith(b"\r\n")
