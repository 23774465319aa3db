"""API keys: `Authorization: Bearer <key>` checked against COSYQ_API_KEYS in constant time.

Every key is compared (no early exit), so the time taken says nothing about which key or how
much of it matched. Keys are never logged. Without keys configured every request is let in (as
tenant "default"), and `cosyq serve` then refuses to bind anything but loopback
(producer/http_bind.py). The key names the request's tenant (`request.state.tenant`, which
`context_of` binds the client to), and the tenant's requests-per-minute quota is counted here.
A wrong key has no tenant: it counts against the client's address instead
(COSYQ_HTTP_AUTH_FAILURES_PER_MINUTE, producer/quotas.py `AuthFailures`), and past that limit
every key from the address, a right one too, is refused 429 until the minute has passed.

Operator keys (COSYQ_OPERATOR_KEYS) are compared in the same loop: an operator's request is
tenant "default" for what it submits and sets `request.state.operator`, which lets it read any
tenant's jobs and documents, manage shared voices and read every tenant's queues in /metrics. A
tenant key never has those rights.
"""

from __future__ import annotations

import hashlib
import hmac

import redis
import structlog
from fastapi import Request

from producer.http.context import context_of
from producer.http.errors import SERVER_ERROR, ApiError, auth_locked_out
from shared.settings_env import redact_urls
from shared.tenants import DEFAULT_TENANT, ApiKey

log = structlog.get_logger("cosyq.http")

_UNAUTHORIZED_HEADERS = {"WWW-Authenticate": "Bearer"}
_DIGEST_LABEL = b"cosyq-ui-session-key:"


def key_digest(key: str) -> str:
    """What a /ui session records of the key that opened it (never the key): a digest the
    key check finds again only while that key is still configured (`matching_digest`)."""
    return hashlib.sha256(_DIGEST_LABEL + key.encode("utf-8")).hexdigest()


class KeyCheck:
    """The dependency every route but /healthz and /readyz runs first."""

    def __init__(
        self, keys: tuple[str | ApiKey, ...], *, operator_keys: tuple[str, ...] = ()
    ) -> None:
        entries = [key if isinstance(key, ApiKey) else ApiKey(DEFAULT_TENANT, key) for key in keys]
        self._keys = tuple(
            [(key.secret.encode("utf-8"), key.tenant, False) for key in entries]
            + [(key.encode("utf-8"), DEFAULT_TENANT, True) for key in operator_keys]
        )
        self._digests = tuple(
            (key_digest(key.decode("utf-8")).encode(), tenant, operator)
            for key, tenant, operator in self._keys
        )

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def __call__(self, request: Request) -> None:
        tenant, operator = self.caller_of(request)
        request.state.tenant = tenant  # the access log line names it too
        request.state.operator = operator
        context_of(request).quota.hit(tenant, operator=operator)

    def tenant_of(self, request: Request) -> str:
        """The tenant of the request's key; 401 without a key or with a wrong one."""
        return self.caller_of(request)[0]

    def caller_of(self, request: Request) -> tuple[str, bool]:
        """(tenant, is an operator key); 401 without a key or with a wrong one. Without keys
        configured (loopback only) every caller is tenant "default" and no operator."""
        if not self._keys:
            return DEFAULT_TENANT, False
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            raise ApiError(
                401,
                "missing API key: send Authorization: Bearer <key>",
                code="invalid_api_key",
                headers=_UNAUTHORIZED_HEADERS,
            )
        found = self.checked_key(request, given.strip())
        if found is None:
            raise ApiError(
                401, "invalid API key", code="invalid_api_key", headers=_UNAUTHORIZED_HEADERS
            )
        return found

    def checked_key(self, request: Request, given: str) -> tuple[str, bool] | None:
        """`matching_key`, counting a wrong key against the client's address (producer/quotas.py
        AuthFailures); 429 once that address is past COSYQ_HTTP_AUTH_FAILURES_PER_MINUTE,
        whatever key it sends (blocking: Redis, from a sync dependency or the thread pool)."""
        found = self.matching_key(given)
        _check_address(request, failed=found is None)
        return found

    def check_address(self, request: Request) -> None:
        """429 while the client's address is past COSYQ_HTTP_AUTH_FAILURES_PER_MINUTE, asked
        before a key is read from a body (the /ui sign-in form), so a locked-out address is
        answered from its headers (blocking: Redis)."""
        if self._keys:
            _check_address(request, failed=False)

    def knows_header(self, authorization: str) -> bool:
        """Whether an Authorization header's value is `Bearer <one of the keys>` (no Redis, no
        count: the body cap's question, asked before the route judges the caller)."""
        scheme, _, given = authorization.partition(" ")
        return scheme.lower() == "bearer" and self.matches(given.strip())

    def matches(self, given: str) -> bool:
        return self.matching_key(given) is not None

    def matching_tenant(self, given: str) -> str | None:
        found = self.matching_key(given)
        return None if found is None else found[0]

    def matching_key(self, given: str) -> tuple[str, bool] | None:
        """(tenant, operator) of the key `given` is, comparing every key (no early exit)."""
        candidate = given.encode("utf-8")
        found: tuple[str, bool] | None = None
        for key, tenant, operator in self._keys:
            if hmac.compare_digest(candidate, key):
                found = (tenant, operator)
        return found

    def matching_digest(self, digest: str) -> tuple[str, bool] | None:
        """(tenant, operator) of the configured key whose `key_digest` this is, comparing
        every one (no early exit); None once that key is gone from the settings."""
        candidate = digest.encode("utf-8")
        found: tuple[str, bool] | None = None
        for known, tenant, operator in self._digests:
            if hmac.compare_digest(candidate, known):
                found = (tenant, operator)
        return found


def _check_address(request: Request, *, failed: bool) -> None:
    """Count a wrong key (`failed`) against the client's address; 429 once it is past the
    limit. Redis failing here is a 503 that names no address: the caller is not judged yet."""
    failures = context_of(request).auth_failures
    address = client_address(request)
    try:
        wait = failures.failed(address) if failed else failures.locked_for(address)
    except redis.RedisError as e:  # the caller is nobody yet: where Redis is is not theirs
        log.warning("http_key_unjudged", error=redact_urls(str(e), keep_user=False))
        raise ApiError(
            503,
            "temporarily unavailable: the key cannot be checked now; retry",
            type_=SERVER_ERROR,
            code="unavailable",
        ) from e
    if wait:
        raise auth_locked_out(failures.per_minute, wait)


def client_address(request: Request) -> str:
    """The address wrong keys are counted against: the peer uvicorn reports, which is the
    X-Forwarded-For client only when the peer is in FORWARDED_ALLOW_IPS (uvicorn's default:
    loopback, so a proxy on the same host; README, HTTP front)."""
    return request.client.host if request.client is not None else "unknown"


def is_operator(request: Request) -> bool:
    """Whether the request came with an operator key (set by the key check)."""
    return getattr(request.state, "operator", False) is True
