"""Two ASGI layers around every request: the body-size cap and the one access-log line.

`BodyLimit` holds every body to a cap, and no body is read ahead of its route: the route
judges its caller from the headers first (the /v1/ key check; a /ui session's cookie and
origin), and its first read answers 413 at once from a Content-Length over the cap, or takes
the whole body in (413 as soon as a chunked one grows past it), so a route never works on a
partial upload. A caller with no key, a wrong one, a key from an address locked out (429), or
no /ui session is answered with its body unread: nobody without a key makes the front wait
for, or hold, a body per connection. Caps: JSON 2 MB (COSYQ_HTTP_MAX_BODY_BYTES); a voice
upload from a caller whose key is one of the front's 16 MB (COSYQ_HTTP_MAX_UPLOAD_BYTES); a
/ui form 4 KB (COSYQ_UI_MAX_FORM_BYTES). `AccessLog` writes one structlog line per request
(method, path, status, duration, job id when a route set `request.state.job_id`); never the
body, so never the text.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from producer.http.errors import ApiError

log = structlog.get_logger("cosyq.http")

UPLOAD_PATHS = frozenset({"/v1/audio/voices"})
FORM_PREFIX = "/ui/"  # the /ui forms (producer/http/ui/): small, read after the caller is judged
CLIENT_CLOSED = 499  # the access log's status for a client gone before its body was in (nginx's)


class BodyLimit:
    """413 for a body over its cap (`max_body_bytes`; `max_upload_bytes` on upload paths from a
    keyed caller; `max_form_bytes` under FORM_PREFIX), read only when its route asks."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        max_upload_bytes: int,
        max_form_bytes: int,
        keyed: Callable[[str], bool] | None = None,
    ) -> None:
        """`keyed(bearer)`: whether the Authorization header's value names one of the front's
        keys (None: no keys, every caller may upload to the upload cap)."""
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_upload_bytes = max_upload_bytes
        self.max_form_bytes = max_form_bytes
        self.keyed = keyed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = self._cap(scope)
        try:
            await self.app(scope, _whole_body(scope, receive, limit, setting), send)
        except ClientDisconnect:
            if not scope.get("state", {}).get("client_disconnected"):
                raise  # not the body's: the app's own error
            # the client went away before its body was in: nothing to answer or run

    def _cap(self, scope: Scope) -> tuple[int, str]:
        """The request's body cap, and the setting that names it."""
        path = scope["path"]
        if path.startswith(FORM_PREFIX):
            return self.max_form_bytes, "COSYQ_UI_MAX_FORM_BYTES"
        if path in UPLOAD_PATHS and (
            self.keyed is None or self.keyed(_header(scope, b"authorization"))
        ):
            return self.max_upload_bytes, "COSYQ_HTTP_MAX_UPLOAD_BYTES"
        return self.max_body_bytes, "COSYQ_HTTP_MAX_BODY_BYTES"


def _whole_body(scope: Scope, receive: Receive, limit: int, setting: str) -> Receive:
    """`receive` whose first call reads the whole body in (413 past `limit`; a client gone
    reads as gone), then hands it on message by message; nothing is read until a route asks."""
    messages: list[Message] | None = None

    async def read_all() -> list[Message]:
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            raise _too_large(limit, setting)  # at once: none of it is read
        read: list[Message] = []
        size = 0
        while True:
            message = await receive()
            read.append(message)
            if message["type"] == "http.disconnect":
                _client_went_away(scope, size)
                return read
            if message["type"] != "http.request":
                return read
            size += len(message.get("body", b""))
            if size > limit:
                raise _too_large(limit, setting)
            if not message.get("more_body", False):
                return read

    async def replay() -> Message:
        nonlocal messages
        if messages is None:
            messages = []  # read once: after a 413, later calls are the connection's own
            messages.extend(await read_all())
        if messages:
            return messages.pop(0)
        return await receive()

    return replay


def _client_went_away(scope: Scope, received: int) -> None:
    """The client closed the connection before its body was in: nothing to answer or run."""
    scope.setdefault("state", {})["client_disconnected"] = True
    log.info("http_client_disconnected", path=scope["path"], received_bytes=received)


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


def _too_large(limit: int, setting: str) -> ApiError:
    """The 413 (the connection closed after it: the rest of the body is never read)."""
    return ApiError(
        413,
        f"request body over {limit:,} bytes ({setting})",
        code="body_too_large",
        headers={"Connection": "close"},
    )


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
