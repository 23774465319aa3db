"""Output keys per tenant (shared/output_keys.py): the producer places a request's key under its
tenant's prefix, the worker checks the placed key again; reserved areas are nobody's to name."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from shared.documents import segment_key
from shared.errors import InvalidRequestError
from shared.output_keys import (
    RESERVED_AREAS,
    automatic_key,
    check_tenant_key,
    owns_key,
    place_output_key,
    tenant_prefix,
)
from shared.storage import object_key

WHEN = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)


def test_a_named_tenant_has_a_prefix_and_the_default_keeps_the_root() -> None:
    assert tenant_prefix("beta") == "tenants/beta/"
    assert tenant_prefix("default") == ""
    assert automatic_key("beta", "j1", "wav", WHEN) == "tenants/beta/2026/12/05/j1.wav"
    assert automatic_key("default", "j1", "wav", WHEN) == "2026/12/05/j1.wav"
    assert object_key("j1", "wav", now=WHEN, tenant="beta") == "tenants/beta/2026/12/05/j1.wav"


@pytest.mark.parametrize("tenant", ["default", "beta"])
def test_placed_keys_stay_in_the_tenants_prefix_and_out_of_reserved_areas(tenant: str) -> None:
    placed = place_output_key(tenant, "orders/42.wav", 512)
    assert placed == tenant_prefix(tenant) + "orders/42.wav"
    assert check_tenant_key(tenant, placed) == placed
    for area in RESERVED_AREAS:
        with pytest.raises(ValueError, match="reserved"):
            place_output_key(tenant, f"{area}/x.wav", 512)
        # a case-insensitive file system (macOS's, Windows' default) reads them as the same
        for spelled in (area.upper(), area.capitalize()):
            with pytest.raises(ValueError, match="reserved"):
                place_output_key(tenant, f"{spelled}/beta/x.wav", 512)
        # Windows drops a name's trailing dots: `tenants./` is `tenants/` there
        for dotted in (f"{area}.", f"{area.capitalize()}.."):
            with pytest.raises(ValueError, match="reserved"):
                place_output_key(tenant, f"{dotted}/beta/x.wav", 512)
    assert place_output_key(tenant, "tenants.d/x.wav", 512).endswith("tenants.d/x.wav")
    with pytest.raises(ValueError, match="limit 20"):
        place_output_key(tenant, "a" * (21 - len(tenant_prefix(tenant))), 20)


@pytest.mark.parametrize(
    ("tenant", "key"),
    [
        ("beta", "tenants/alpha/x.wav"),  # another tenant's prefix
        ("beta", "x.wav"),  # outside its own prefix
        ("beta", "tenants/beta/voices/alice/prompt.wav"),  # its own reserved area
        ("default", "tenants/beta/x.wav"),
        ("default", "voices/alice/prompt.wav"),
        ("default", "documents/d1/segments/00000.wav"),  # no such segment job
        ("default", "Tenants/beta/x.wav"),  # beta's prefix on a case-insensitive disk
        ("default", "VOICES/beta/alice/prompt.wav"),
        ("default", "tenants./beta/x.wav"),  # beta's prefix on Windows (trailing dots dropped)
        ("default", "Voices../beta/alice/prompt.wav"),
        ("beta", "tenants/beta/documents./d1/d1.wav"),
        ("beta", "tenants/beta/Documents/d1/d1.wav"),
    ],
)
def test_the_worker_refuses_keys_its_job_may_not_write(tenant: str, key: str) -> None:
    with pytest.raises(InvalidRequestError, match="output_key"):
        check_tenant_key(tenant, key)
    with pytest.raises(InvalidRequestError, match="output_key"):
        object_key("j1", "wav", key, tenant=tenant)


def test_a_segment_job_may_write_its_own_segment_only() -> None:
    own = "tenants/beta/" + segment_key("d1", 3)
    assert check_tenant_key("beta", own, ("d1", 3)) == own
    for document in (("d1", 4), ("d2", 3), None):
        with pytest.raises(InvalidRequestError):
            check_tenant_key("beta", own, document)
    with pytest.raises(InvalidRequestError):  # the same segment, another tenant's job
        check_tenant_key("alpha", own, ("d1", 3))


def test_a_tenant_owns_its_prefix_and_its_documents_only() -> None:
    assert owns_key("beta", "tenants/beta/2026/12/05/j1.wav")
    assert owns_key("beta", "tenants/beta/" + segment_key("d1", 0))
    assert owns_key("default", "2026/12/05/j1.wav") and owns_key("default", segment_key("d1", 0))
    assert owns_key(None, "tenants/beta/x.wav")  # nobody's: an operator's read, any tenant's
    for tenant, key in (
        ("beta", "tenants/alpha/x.wav"),
        ("beta", "tenants/beta2/x.wav"),
        ("beta", "x.wav"),
        ("beta", "tenants/beta/voices/x.wav"),
        ("default", "tenants/beta/x.wav"),
        ("default", "Tenants/beta/x.wav"),
        ("default", "tenants./beta/x.wav"),
        ("default", "voices/beta/alice/prompt.wav"),
    ):
        assert not owns_key(tenant, key), (tenant, key)
