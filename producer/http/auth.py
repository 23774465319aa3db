"""API keys: `Authorization: Bearer <key>` checked against COSYQ_API_KEYS in constant time.

Every key is compared (no early exit), so the time taken says nothing about which key or how
much of it matched. Keys are never logged. Without keys configured every request is let in, and
`cosyq serve` then refuses to bind anything but loopback (producer/http_bind.py).
"""

from __future__ import annotations

import hmac

from fastapi import Request

from producer.http.errors import ApiError

_UNAUTHORIZED_HEADERS = {"WWW-Authenticate": "Bearer"}


class KeyCheck:
    """The dependency every route but /healthz and /readyz runs first."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        self._keys = tuple(key.encode("utf-8") for key in keys)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def __call__(self, request: Request) -> None:
        if not self._keys:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise ApiError(
                401,
                "missing API key: send Authorization: Bearer <key>",
                code="invalid_api_key",
                headers=_UNAUTHORIZED_HEADERS,
            )
        if not self.matches(given.strip()):
            raise ApiError(
                401, "invalid API key", code="invalid_api_key", headers=_UNAUTHORIZED_HEADERS
            )

    def matches(self, given: str) -> bool:
        candidate = given.encode("utf-8")
        found = False
        for key in self._keys:
            found |= hmac.compare_digest(candidate, key)
        return found
