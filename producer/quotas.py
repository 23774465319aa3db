"""Requests per minute per tenant, and wrong keys per minute per client address, counted in
Redis so every `cosyq serve` process and host shares one count.

The `limits` library's moving window on its Redis storage: each hit is one Lua script (check
and record at once, atomic across processes), on the front's own Redis connection pool (TLS,
Sentinel and timeouts as configured). The queued-jobs quota is the client's (producer/client.py):
it is a count of the tenant's queues, read where the jobs are enqueued.
"""

from __future__ import annotations

import math
import time

import redis
import structlog
from limits import RateLimitItem, RateLimitItemPerMinute
from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter

from shared import keys
from shared.errors import TenantQuotaError
from shared.plurals import counted
from shared.settings import Settings

log = structlog.get_logger("cosyq.http")

MIN_RETRY_AFTER_S = 1  # a Retry-After of 0 would invite an immediate retry


OPERATORS = "_operators"  # the operator keys' own count (no tenant name starts with "_")


class RequestQuota:
    """`hit(tenant)` counts one request, or raises TenantQuotaError (requests_per_minute).
    Operator keys (`operator=True`) act as the tenant "default" for what they submit, but
    their requests are counted apart, at COSYQ_TENANT_REQUESTS_PER_MINUTE: a tenant spending
    its minute never locks operators out, nor do operators spend the tenant's."""

    def __init__(self, connection: redis.Redis, settings: Settings) -> None:
        self.settings = settings
        self.limiter = moving_window(connection, keys.QUOTA_PREFIX)

    def hit(self, tenant: str, *, operator: bool = False) -> None:
        bucket = OPERATORS if operator else tenant
        per_minute = self.settings.requests_per_minute(bucket)
        item = RateLimitItemPerMinute(per_minute)
        if self.limiter.hit(item, bucket):
            return
        wait = _wait_s(self.limiter, item, bucket)
        who = "operator keys" if operator else f"tenant {tenant}"
        raise TenantQuotaError(
            f"{who} made {counted(per_minute, 'request')} in the last minute (quota "
            f"requests_per_minute {per_minute:,}, COSYQ_TENANT_QUOTAS); retry in {wait} s",
            tenant=tenant,
            quota="requests_per_minute",
            retry_after_s=wait,
        )


class AuthFailures:
    """Wrong keys per client address (COSYQ_HTTP_AUTH_FAILURES_PER_MINUTE; 0: not counted).

    `failed(address)` counts one wrong key; once an address has sent the limit's worth within
    a minute (a moving window, like RequestQuota's), `locked_for(address)` says how long every
    key from it, a right one too, is refused: otherwise the limit would not stop guessing.
    Counting a failure refuses atomically at the limit, so no number of concurrent guesses gets
    more than the limit judged per minute."""

    def __init__(self, connection: redis.Redis, settings: Settings) -> None:
        self.per_minute = settings.http_auth_failures_per_minute
        self.limiter = moving_window(connection, keys.AUTH_FAILURE_PREFIX)
        self.item = RateLimitItemPerMinute(max(1, self.per_minute))

    def locked_for(self, address: str) -> int:
        """Seconds until `address` may present a key again; 0: it may now."""
        if self.per_minute == 0 or self.limiter.test(self.item, address):
            return 0
        return _wait_s(self.limiter, self.item, address)

    def failed(self, address: str) -> int:
        """Count one wrong key from `address`: 0 when counted (the caller answers 401), else
        the seconds it stays locked out (already at the limit: nothing was judged, 429).
        The failure that fills the window logs the lock-out, once, without the key."""
        if self.per_minute == 0:
            return 0
        if not self.limiter.hit(self.item, address):
            return _wait_s(self.limiter, self.item, address)
        if not self.limiter.test(self.item, address):
            log.warning(
                "http_auth_locked_out",
                client=address,
                failures_per_minute=self.per_minute,
                retry_after_s=_wait_s(self.limiter, self.item, address),
            )
        return 0


def moving_window(connection: redis.Redis, prefix: str) -> MovingWindowRateLimiter:
    """The `limits` moving window on the front's own Redis pool, its keys under `prefix`."""
    storage = RedisStorage(
        "redis://", connection_pool=connection.connection_pool, key_prefix=prefix
    )
    return MovingWindowRateLimiter(storage)


def _wait_s(limiter: MovingWindowRateLimiter, item: RateLimitItem, identifier: str) -> int:
    """Whole seconds until the oldest hit in `identifier`'s window leaves it (at least 1)."""
    reset_at = limiter.get_window_stats(item, identifier).reset_time
    return max(MIN_RETRY_AFTER_S, math.ceil(reset_at - time.time()))
