"""Two ASGI layers around every request: the body-size cap and the one access-log line.

`BodyLimit` answers 413 before the app sees a body over the cap: at once from Content-Length,
or as soon as a chunked body grows past it (the body is read ahead, so a route never works on a
partial upload). Voice uploads get their own, larger cap. A request to a keyed route (under
KEYED_PREFIX) whose Authorization header names none of the front's keys is not read ahead: its
route's key check answers 401 (or 429, the address locked out) from the headers, counting a
wrong key against the address, the body unread and held to the JSON cap; so nobody without a key
makes the front wait for, or hold, a body (2 MB of JSON, 16 MB of upload) per connection.
`AccessLog` writes one structlog line per request (method, path, status, duration, job id when
a route set `request.state.job_id`); never the body, so never the text.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producer.http.errors import ApiError

log = structlog.get_logger("cosyq.http")

UPLOAD_PATHS = frozenset({"/v1/audio/voices"})
KEYED_PREFIX = "/v1/"  # every route behind the key check (app.KEYED_ROUTERS), and only those
CLIENT_CLOSED = 499  # the access log's status for a client gone before its body was in (nginx's)


class BodyLimit:
    """413 for a body over `max_body_bytes` (`max_upload_bytes` on upload paths)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        max_upload_bytes: int,
        keyed: Callable[[str], bool] | None = None,
    ) -> None:
        """`keyed(bearer)`: whether the Authorization header's value names one of the front's
        keys (None: no keys, every caller's body is read ahead, an upload to its own cap)."""
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes
        self.keyed = keyed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_body_bytes
        if self._unkeyed(scope):
            await self.app(scope, _capped(receive, limit), send)
            return  # its key check refuses it from its headers; what it reads stays capped
        if scope["path"] in UPLOAD_PATHS:
            limit = self.max_upload_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _too_large(scope, send, limit)
            return
        messages: list[Message] = []
        size = 0
        more = True
        while more:
            message = await receive()
            messages.append(message)
            if message["type"] == "http.disconnect":
                _client_went_away(scope, size)
                return
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > limit:
                await _too_large(scope, send, limit)
                return
            more = bool(message.get("more_body", False))

        async def replay() -> Message:
            if messages:
                return messages.pop(0)
            return await receive()

        await self.app(scope, replay, send)

    def _unkeyed(self, scope: Scope) -> bool:
        """A request to a keyed route whose Authorization header names none of the keys."""
        if self.keyed is None or not scope["path"].startswith(KEYED_PREFIX):
            return False
        return not self.keyed(_header(scope, b"authorization"))


def _client_went_away(scope: Scope, received: int) -> None:
    """The client closed the connection before its body was in: nothing to answer or run."""
    scope.setdefault("state", {})["client_disconnected"] = True
    log.info("http_client_disconnected", path=scope["path"], received_bytes=received)


def _capped(receive: Receive, limit: int) -> Receive:
    """`receive` that reads as a client gone once the body read passes `limit` (nothing read
    ahead: a route that answers from the headers reads nothing)."""
    size = 0

    async def capped() -> Message:
        nonlocal size
        message = await receive()
        size += len(message.get("body", b""))
        return {"type": "http.disconnect"} if size > limit else message

    return capped


def _header(scope: Scope, wanted: bytes) -> str:
    for name, value in scope.get("headers", ()):
        if name == wanted:
            return value.decode("latin-1")
    return ""


def _content_length(scope: Scope) -> int | None:
    try:
        return int(_header(scope, b"content-length")) if _header(scope, b"content-length") else None
    except ValueError:
        return None


async def _too_large(scope: Scope, send: Send, limit: int) -> None:
    setting = (
        "COSYQ_HTTP_MAX_UPLOAD_BYTES"
        if scope["path"] in UPLOAD_PATHS
        else ("COSYQ_HTTP_MAX_BODY_BYTES")
    )
    error = ApiError(413, f"request body over {limit:,} bytes ({setting})", code="body_too_large")
    response = error.response()
    response.headers["Connection"] = "close"
    await response(scope, _never_receive, send)


async def _never_receive() -> Message:
    return {"type": "http.disconnect"}


class AccessLog:
    """One line per request, after its response has been sent (or the client went away)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: dict[str, Any] = {"code": 500}
        state = scope.setdefault("state", {})

        async def record(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, record)
        finally:
            gone = state.get("client_disconnected") and status["code"] == 500
            log.info(
                "http_request",
                method=scope["method"],
                path=scope["path"],
                status=CLIENT_CLOSED if gone else status["code"],
                duration_ms=round(1000 * (time.perf_counter() - started), 2),
                job_id=state.get("job_id"),
                tenant=state.get("tenant"),  # set by the key check (producer/http/auth.py)
            )
