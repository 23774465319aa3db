"""Tenant settings (`COSYQ_TENANT*`): which tenants exist and their quotas, a block of
`Settings` fields kept apart so settings.py stays small.

The tenants are "default", those named in COSYQ_API_KEYS and those in COSYQ_TENANTS (for
workers, which need the names but never the keys). Quotas are per tenant; COSYQ_TENANT_QUOTAS
overrides the defaults for the tenants it names, as JSON:
`{"billing": {"max_queued_jobs": 500, "requests_per_minute": 60, "max_priority": "default",
"max_voices": 20, "max_waits": 4}}`. A voice stays in Redis until it is removed (up to a
megabyte for a 30 s prompt), so a tenant's voices are counted too: the front refuses an upload
past the count and a worker refuses to store one, so concurrent uploads never pass it (shared
voices, an operator's, are not counted). A request that waits for its job holds a Redis
connection of its front process: `max_waits` counts them (producer/http/waits.py).
A tenant's highest priority matters because workers serve priorities first, every tenant's
`high` queue before any tenant's `default`: a tenant that may send `high` can hold back every
other tenant's `default` and `low` jobs for as long as its backlog lasts.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.errors import UnknownTenantError
from shared.keys import QUEUES_IN_PRIORITY_ORDER, queue_for
from shared.settings_bounds import CEILINGS
from shared.tenants import check_tenant_name

# The highest priority a tenant may be held to: `default` takes `high` away (a tenant's `high`
# jobs go before every tenant's `default` ones); `low` would refuse requests naming no priority.
MaxPriority = Literal["high", "default"]


class TenantQuota(BaseModel):
    """One tenant's overrides; a field left out keeps the default."""

    model_config = ConfigDict(extra="forbid")

    max_queued_jobs: int | None = Field(None, gt=0, le=CEILINGS["tenant_max_queued_jobs"])
    requests_per_minute: int | None = Field(None, gt=0, le=CEILINGS["tenant_requests_per_minute"])
    max_priority: MaxPriority | None = None
    max_voices: int | None = Field(None, gt=0, le=CEILINGS["tenant_max_voices"])
    max_waits: int | None = Field(None, gt=0, le=CEILINGS["tenant_max_waits"])


class TenantSettings(BaseModel):
    tenants: str | None = Field(
        None,
        description='comma-separated tenant names workers take jobs for, besides "default" '
        "and the tenants of COSYQ_API_KEYS",
    )
    tenant_max_queued_jobs: int = Field(
        10000, gt=0, description="most jobs one tenant may have waiting, all priorities together"
    )
    tenant_requests_per_minute: int = Field(
        600, gt=0, description="most HTTP requests one tenant may make per minute (all routes)"
    )
    tenant_max_priority: MaxPriority = Field(
        "high", description="highest priority a tenant's requests may ask for (high or default)"
    )
    tenant_max_voices: int = Field(
        100, gt=0, description="most voices one tenant may keep (shared voices are not counted)"
    )
    tenant_max_waits: int = Field(
        16,
        gt=0,
        description="most requests of one tenant one `cosyq serve` process holds waiting at "
        "once (speech, voice uploads, stream relays: each holds a Redis connection)",
    )
    tenant_quotas: dict[str, TenantQuota] = Field(
        {}, description="per-tenant overrides of the quotas (JSON)"
    )

    @field_validator("tenants")
    @classmethod
    def _check_tenants(cls, value: str | None) -> str | None:
        for part in (value or "").split(","):
            if part.strip():
                _named(part.strip())
        return value

    @field_validator("tenant_quotas")
    @classmethod
    def _check_quota_names(cls, value: dict[str, TenantQuota]) -> dict[str, TenantQuota]:
        for name in value:
            _named(name)
        return value

    def max_queued_jobs(self, tenant: str) -> int:
        override = self.tenant_quotas.get(tenant)
        if override is not None and override.max_queued_jobs is not None:
            return override.max_queued_jobs
        return self.tenant_max_queued_jobs

    def requests_per_minute(self, tenant: str) -> int:
        override = self.tenant_quotas.get(tenant)
        if override is not None and override.requests_per_minute is not None:
            return override.requests_per_minute
        return self.tenant_requests_per_minute

    def max_voices(self, tenant: str) -> int:
        override = self.tenant_quotas.get(tenant)
        if override is not None and override.max_voices is not None:
            return override.max_voices
        return self.tenant_max_voices

    def max_waits(self, tenant: str) -> int:
        override = self.tenant_quotas.get(tenant)
        if override is not None and override.max_waits is not None:
            return override.max_waits
        return self.tenant_max_waits

    def max_priority(self, tenant: str) -> MaxPriority:
        override = self.tenant_quotas.get(tenant)
        if override is not None and override.max_priority is not None:
            return override.max_priority
        return self.tenant_max_priority

    def allows_priority(self, tenant: str, priority: str) -> bool:
        """Whether `tenant`'s requests may ask for `priority` (none above its max_priority)."""
        rank = QUEUES_IN_PRIORITY_ORDER.index
        return rank(queue_for(priority)) >= rank(queue_for(self.max_priority(tenant)))


def _named(name: str) -> str:
    try:
        return check_tenant_name(name)
    except UnknownTenantError as e:
        raise ValueError(str(e)) from e
