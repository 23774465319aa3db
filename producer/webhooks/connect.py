"""How the dispatcher reaches a receiver: to an address it checked, within one deadline.

An httpcore network backend (httpcore's documented hook for how connections are opened): the
receiver's host is resolved once, every address is judged (`shared/webhook_addresses.py`), and
the socket is opened to a checked address; the URL, the Host header, TLS SNI and certificate
checks keep the host name. No second resolution happens anywhere, so a DNS answer that changes
between the check and the connect is never used.

The deadline (COSYQ_WEBHOOK_TIMEOUT_S) is for the whole request: every connect, TLS handshake,
write and read gets what is left of it, so a receiver that trickles one byte at a time is cut
off when the deadline passes, not after each read's own timeout.
"""

from __future__ import annotations

import time
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import httpcore

from shared.webhook_addresses import checked_addresses

DEADLINE_PASSED = "the delivery's deadline (COSYQ_WEBHOOK_TIMEOUT_S) passed"
_deadline: ContextVar[float | None] = ContextVar("cosyq_webhook_deadline", default=None)


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Every network step on this thread within the block ends `seconds` from now at latest."""
    token = _deadline.set(time.monotonic() + seconds)
    try:
        yield
    finally:
        _deadline.reset(token)


def _left(timeout: float | None, expired: type[Exception]) -> float | None:
    """The smaller of a step's own timeout and what is left of the deadline."""
    end = _deadline.get()
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise expired(DEADLINE_PASSED)
    return left if timeout is None else min(timeout, left)


@contextmanager
def _naming_the_deadline() -> Iterator[None]:
    """A step's timeout that the deadline cut short says so."""
    try:
        yield
    except httpcore.TimeoutException as e:
        end = _deadline.get()
        if end is not None and time.monotonic() >= end:
            raise type(e)(DEADLINE_PASSED) from e
        raise


class DeadlineStream(httpcore.NetworkStream):
    """A connection whose every step is bounded by the deadline of the request using it."""

    def __init__(self, stream: httpcore.NetworkStream) -> None:
        self.stream = stream

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        with _naming_the_deadline():
            return self.stream.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        with _naming_the_deadline():
            self.stream.write(buffer, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self.stream.close()

    def start_tls(
        self,
        ssl_context: typing.Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        left = _left(timeout, httpcore.ConnectTimeout)
        return DeadlineStream(self.stream.start_tls(ssl_context, server_hostname, left))

    def get_extra_info(self, info: str) -> typing.Any:
        return self.stream.get_extra_info(info)


class CheckedBackend(httpcore.SyncBackend):
    """Opens TCP connections only to addresses that passed the webhook address check."""

    def __init__(self, *, allow_private: bool) -> None:
        self.allow_private = allow_private

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        """AddressRefused (not an httpcore error: permanent) when an address is refused."""
        try:
            addresses = checked_addresses(host, port, allow_private=self.allow_private)
        except OSError as e:
            raise httpcore.ConnectError(f"cannot resolve {host}: {e}") from e
        failure: Exception = httpcore.ConnectError(f"{host} has no address")
        for address in addresses:
            left = _left(timeout, httpcore.ConnectTimeout)
            try:
                stream = super().connect_tcp(
                    str(address), port, left, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as e:
                failure = e
                continue
            return DeadlineStream(stream)
        raise failure
