"""One deadline for a request to arrive, enforced on uvicorn's connection (slow-loris).

An ASGI app sees a request only once its headers are in, so a client that sends a header line
every few seconds, or a body a byte at a time, holds a connection for as long as it likes unless
the server's protocol bounds it. `ReadDeadlineProtocol` is uvicorn's h11 protocol with a timer
that starts when a connection opens (or, on a kept-alive connection, when the next request's
first bytes come) and stops once the whole request (headers and body) has arrived; when it fires
first, the client is answered 408 (if nothing was answered yet) and disconnected.
`cosyq serve` passes it as uvicorn's `http` with COSYQ_HTTP_REQUEST_READ_TIMEOUT_S.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

log = structlog.get_logger("cosyq.http")

SETTING = "COSYQ_HTTP_REQUEST_READ_TIMEOUT_S"


CLOSE_AFTER_EOF_S = 0.5  # after a 408: time for the client to read it before the close


def timeout_response(read_timeout_s: float) -> bytes:
    """A 408 in the API's error shape, written straight to the socket."""
    message = f"request: did not arrive within {read_timeout_s:g} s ({SETTING})"
    error = {"message": message, "type": "invalid_request_error", "param": None}
    body = json.dumps({"error": error | {"code": "request_timeout"}}).encode()
    head = (
        "HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class ReadDeadlineProtocol(H11Protocol):
    """uvicorn's h11 protocol; a request must arrive whole within `read_timeout_s`."""

    def __init__(self, *args: Any, read_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.read_timeout_s = read_timeout_s
        self._deadline: asyncio.TimerHandle | None = None
        self._cycle_before: object = None  # the cycle in place when the timer started
        self._timed_out = False  # answered 408: what still arrives is dropped, not parsed

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start()

    def data_received(self, data: bytes) -> None:
        if self._timed_out:
            return
        if self._deadline is None and not self._answering():
            self._start()
        super().data_received(data)
        if self._deadline is not None and self._arrived():
            self._stop()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop()
        super().connection_lost(exc)

    def _start(self) -> None:
        self._cycle_before = self.cycle
        self._deadline = self.loop.call_later(self.read_timeout_s, self._too_slow)

    def _stop(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _arrived(self) -> bool:
        """A request began after the timer started and its body is complete."""
        cycle = self.cycle
        return cycle is not None and cycle is not self._cycle_before and not cycle.more_body

    def _answering(self) -> bool:
        """A request has arrived and is being answered (later bytes are a pipelined request)."""
        cycle = self.cycle
        return cycle is not None and not cycle.more_body and not cycle.response_complete

    def _too_slow(self) -> None:
        self._deadline = None
        if self._arrived() or self.transport.is_closing():
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else None
        log.warning("http_request_read_timeout", client=client, timeout_s=self.read_timeout_s)
        cycle = self.cycle
        if cycle is None or cycle is self._cycle_before or not cycle.response_started:
            self.transport.write(timeout_response(self.read_timeout_s))
        self._timed_out = True
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        # The answer and a FIN first, the close a moment later: closing with a slow client's
        # unread bytes here sends a reset, which can reach the client before it read the 408
        # (its kernel then drops the answer).
        self.transport.write_eof()
        self.loop.call_later(CLOSE_AFTER_EOF_S, self.transport.close)
