"""API keys: `Authorization: Bearer <key>` checked against COSYQ_API_KEYS in constant time.

Every key is compared (no early exit), so the time taken says nothing about which key or how
much of it matched. Keys are never logged. Without keys configured every request is let in (as
tenant "default"), and `cosyq serve` then refuses to bind anything but loopback
(producer/http_bind.py). The key names the request's tenant (`request.state.tenant`, which
`context_of` binds the client to), and the tenant's requests-per-minute quota is counted here.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from producer.http.context import context_of
from producer.http.errors import ApiError
from shared.tenants import DEFAULT_TENANT, ApiKey

_UNAUTHORIZED_HEADERS = {"WWW-Authenticate": "Bearer"}


class KeyCheck:
    """The dependency every route but /healthz and /readyz runs first."""

    def __init__(self, keys: tuple[str | ApiKey, ...]) -> None:
        entries = [key if isinstance(key, ApiKey) else ApiKey(DEFAULT_TENANT, key) for key in keys]
        self._keys = tuple((key.secret.encode("utf-8"), key.tenant) for key in entries)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def __call__(self, request: Request) -> None:
        tenant = self.tenant_of(request)
        request.state.tenant = tenant  # the access log line names it too
        context_of(request).quota.hit(tenant)

    def tenant_of(self, request: Request) -> str:
        """The tenant of the request's key; 401 without a key or with a wrong one."""
        if not self._keys:
            return DEFAULT_TENANT
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise ApiError(
                401,
                "missing API key: send Authorization: Bearer <key>",
                code="invalid_api_key",
                headers=_UNAUTHORIZED_HEADERS,
            )
        tenant = self.matching_tenant(given.strip())
        if tenant is None:
            raise ApiError(
                401, "invalid API key", code="invalid_api_key", headers=_UNAUTHORIZED_HEADERS
            )
        return tenant

    def matches(self, given: str) -> bool:
        return self.matching_tenant(given) is not None

    def matching_tenant(self, given: str) -> str | None:
        """The tenant of the key `given` is, comparing every key (no early exit)."""
        candidate = given.encode("utf-8")
        found: str | None = None
        for key, tenant in self._keys:
            if hmac.compare_digest(candidate, key):
                found = tenant
        return found
