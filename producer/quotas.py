"""Requests per minute per tenant, counted in Redis so every `cosyq serve` process and host
shares one count.

The `limits` library's moving window on its Redis storage: each hit is one Lua script (check
and record at once, atomic across processes), on the front's own Redis connection pool (TLS,
Sentinel and timeouts as configured). The queued-jobs quota is the client's (producer/client.py):
it is a count of the tenant's queues, read where the jobs are enqueued.
"""

from __future__ import annotations

import math
import time

import redis
from limits import RateLimitItemPerMinute
from limits.storage import RedisStorage
from limits.strategies import MovingWindowRateLimiter

from shared import keys
from shared.errors import TenantQuotaError
from shared.settings import Settings

MIN_RETRY_AFTER_S = 1  # a Retry-After of 0 would invite an immediate retry


OPERATORS = "_operators"  # the operator keys' own count (no tenant name starts with "_")


class RequestQuota:
    """`hit(tenant)` counts one request, or raises TenantQuotaError (requests_per_minute).
    Operator keys (`operator=True`) act as the tenant "default" for what they submit, but
    their requests are counted apart, at COSYQ_TENANT_REQUESTS_PER_MINUTE: a tenant spending
    its minute never locks operators out, nor do operators spend the tenant's."""

    def __init__(self, connection: redis.Redis, settings: Settings) -> None:
        self.settings = settings
        storage = RedisStorage(
            "redis://", connection_pool=connection.connection_pool, key_prefix=keys.QUOTA_PREFIX
        )
        self.limiter = MovingWindowRateLimiter(storage)

    def hit(self, tenant: str, *, operator: bool = False) -> None:
        counted = OPERATORS if operator else tenant
        per_minute = self.settings.requests_per_minute(counted)
        item = RateLimitItemPerMinute(per_minute)
        if self.limiter.hit(item, counted):
            return
        reset_at = self.limiter.get_window_stats(item, counted).reset_time
        wait = max(MIN_RETRY_AFTER_S, math.ceil(reset_at - time.time()))
        who = "operator keys" if operator else f"tenant {tenant}"
        raise TenantQuotaError(
            f"{who} made {per_minute:,} requests in the last minute (quota "
            f"requests_per_minute {per_minute:,}, COSYQ_TENANT_QUOTAS); retry in {wait} s",
            tenant=tenant,
            quota="requests_per_minute",
            retry_after_s=wait,
        )
