"""Requests that wait: each holds one connection of its front process's asyncio Redis pool.

POST /v1/audio/speech, a voice upload's answer and a stream relay block in XREAD until their
job ends or speaks (`FrontContext.wait_until_done`, producer/http/streaming.py `entries`), one
pooled connection each. Without a count, one tenant's waits at once (well within its
requests_per_minute) took the whole pool, and every other request of every tenant that needed
it, /readyz included, was answered 503 "Too many connections" until they ended.

So waits are counted in the process (the pool is the process's; only the event loop counts, so
no lock): per tenant (COSYQ_TENANT_MAX_WAITS, `max_waits` in COSYQ_TENANT_QUOTAS), past which
the tenant is answered 429 `max_waits`, and in all (COSYQ_HTTP_MAX_WAITS), past which 503
`busy`. The pool holds COSYQ_HTTP_MAX_WAITS + POOL_HEADROOM connections: the headroom is for
the short reads of every other request, which waits never take.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from producer.http.errors import SERVER_ERROR, ApiError
from shared.errors import TenantQuotaError
from shared.plurals import counted
from shared.settings import Settings
from shared.tenants import DEFAULT_TENANT

POOL_HEADROOM = 32  # pooled connections beyond the waits: every other request's short reads


def pool_size(settings: Settings) -> int:
    """The front's asyncio Redis pool: every wait, and room for everything else."""
    return settings.http_max_waits + POOL_HEADROOM


@dataclass
class Held:
    """One wait held; `release()` gives it back (once, however often it is called). A context
    manager that releases at its end."""

    waits: Waits
    tenant: str
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.waits.give_back(self.tenant)

    def __enter__(self) -> Held:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


@dataclass
class Waits:
    """The waits this process holds now, per tenant."""

    settings: Settings
    held: Counter[str] = field(default_factory=Counter)

    def take(self, tenant: str) -> Held:
        """Hold one of `tenant`'s waits; refused (429 `max_waits`, 503 `busy`) when none is
        free. Taken before a route submits its job: a refused wait queues nothing."""
        limit = self._tenant_limit(tenant)
        retry_after_s = self.settings.http_retry_after_s
        if limit is not None and self.held[tenant] >= limit:
            raise TenantQuotaError(
                f"tenant {tenant} has {counted(self.held[tenant], 'request')} waiting on this "
                f"front (quota max_waits {limit:,}, COSYQ_TENANT_MAX_WAITS, COSYQ_TENANT_QUOTAS); "
                "nothing was submitted: poll GET /v1/jobs/{id} instead, or retry when one ends",
                tenant=tenant,
                quota="max_waits",
                retry_after_s=retry_after_s,
            )
        if self.held.total() >= self.settings.http_max_waits:
            raise ApiError(
                503,
                f"this front holds {counted(self.held.total(), 'request')} waiting "
                f"(COSYQ_HTTP_MAX_WAITS {self.settings.http_max_waits:,}); nothing was "
                "submitted; retry",
                type_=SERVER_ERROR,
                code="busy",
                headers={"Retry-After": str(retry_after_s)},
            )
        self.held[tenant] += 1
        return Held(self, tenant)

    def _tenant_limit(self, tenant: str) -> int | None:
        """The tenant's `max_waits`; None (no count of its own) in a deployment of one tenant
        (no keys, or only default's) that set none: nobody to keep its waits from, so
        COSYQ_HTTP_MAX_WAITS holds it alone."""
        settings = self.settings
        set_here = (
            "tenant_max_waits" in settings.model_fields_set or tenant in settings.tenant_quotas
        )
        if settings.tenant_names() == (DEFAULT_TENANT,) and not set_here:
            return None
        return settings.max_waits(tenant)

    def give_back(self, tenant: str) -> None:
        self.held[tenant] -= 1
        if self.held[tenant] <= 0:
            del self.held[tenant]
