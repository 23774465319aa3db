"""producer/http/waits.py: a tenant's waits are counted up to its `max_waits` (a
COSYQ_TENANT_QUOTAS override or COSYQ_TENANT_MAX_WAITS), all tenants' up to
COSYQ_HTTP_MAX_WAITS, and a held wait is given back once however often it is released."""

from __future__ import annotations

import pytest

from producer.http.errors import ApiError
from producer.http.waits import POOL_HEADROOM, Waits, pool_size
from shared.errors import TenantQuotaError
from shared.settings import Settings


def settings() -> Settings:
    return Settings(tenant_max_waits=3, http_max_waits=4, tenant_quotas={"alpha": {"max_waits": 1}})


def test_a_tenant_past_its_waits_is_refused_naming_the_quota() -> None:
    waits = Waits(settings())
    held = waits.take("alpha")
    with pytest.raises(TenantQuotaError) as refused:
        waits.take("alpha")
    assert refused.value.quota == "max_waits" and refused.value.tenant == "alpha"
    held.release()
    held.release()  # once
    assert waits.held == {}
    with waits.take("alpha"):
        assert waits.held == {"alpha": 1}
    assert waits.held == {}


def test_all_tenants_past_the_fronts_waits_are_refused_503_busy() -> None:
    waits = Waits(settings())
    held = [waits.take("beta") for _ in range(3)] + [waits.take("gamma")]
    with pytest.raises(ApiError) as busy:
        waits.take("delta")
    assert (busy.value.status, busy.value.code) == (503, "busy")
    for one in held:
        one.release()
    assert waits.held == {}
    assert pool_size(settings()) == 4 + POOL_HEADROOM


def test_one_tenant_alone_is_held_only_by_the_fronts_waits_unless_it_set_its_own() -> None:
    alone = Waits(Settings(http_max_waits=20))  # no keys: every request is default's
    held = [alone.take("default") for _ in range(20)]
    with pytest.raises(ApiError) as busy:
        alone.take("default")
    assert busy.value.code == "busy"
    for one in held:
        one.release()
    chosen = Waits(Settings(http_max_waits=20, tenant_max_waits=2))
    chosen.take("default")
    chosen.take("default")
    with pytest.raises(TenantQuotaError):
        chosen.take("default")
    keyed = Waits(Settings(http_max_waits=20, api_keys="alpha:ka,beta:kb"))
    for _ in range(16):  # the default COSYQ_TENANT_MAX_WAITS where tenants share the front
        keyed.take("alpha")
    with pytest.raises(TenantQuotaError):
        keyed.take("alpha")
