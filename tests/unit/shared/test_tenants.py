"""Keys with tenants, tenant queue names, and the rotation fair share rests on."""

from __future__ import annotations

import pytest

from shared import keys, tenants
from shared.errors import SettingsError, UnknownTenantError
from shared.settings import load_settings

SECRET = "sk-" + "9" * 20


def test_keys_name_their_tenant_and_plain_keys_stay_default() -> None:
    parsed = tenants.parse_api_keys(f"billing:sk-b, {SECRET} ,search:sk:with:colons,")
    assert [(k.tenant, k.secret) for k in parsed] == [
        ("billing", "sk-b"),
        ("default", SECRET),
        ("search", "sk:with:colons"),
    ]
    assert SECRET not in repr(parsed)


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (f"Bad Tenant:{SECRET}", "entry 1: the tenant before ':' must be"),
        (f":{SECRET}", "entry 1: the tenant before ':' must be"),
        ("ok:sk-1,billing:", "entry 2: the key after the tenant is empty"),
        (f"a.b:{SECRET}", "entry 1: the tenant"),
        (f"a:{SECRET},b:{SECRET}", "entry 2: the same key as an earlier entry"),
    ],
)
def test_a_malformed_entry_is_one_settings_error_that_never_shows_the_key(
    raw: str, problem: str
) -> None:
    with pytest.raises(SettingsError, match=problem) as caught:
        tenants.parse_api_keys(raw)
    assert SECRET not in str(caught.value)


def test_load_settings_refuses_a_malformed_entry_in_one_line_without_the_key() -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(None, api_keys=f"billing:{SECRET},Nope Nope:{SECRET}x")
    message = str(caught.value)
    assert "COSYQ_API_KEYS" in message and "entry 2" in message and "\n" not in message
    assert SECRET not in message


OPERATOR = "op-" + "8" * 20


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        (f"{OPERATOR},{OPERATOR}", "entry 2: the same key as an earlier entry"),
        (f"ok-key,{OPERATOR} x", "entry 2: the key holds spaces"),
        (f"ok-key,{SECRET}", "entry 2: the same key as an entry of COSYQ_API_KEYS"),
    ],
)
def test_operator_keys_are_secret_and_never_a_tenants_key(raw: str, problem: str) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings(None, api_keys=f"billing:{SECRET}", operator_keys=raw)
    message = str(caught.value)
    assert "COSYQ_OPERATOR_KEYS " + problem in message and "\n" not in message
    assert SECRET not in message and OPERATOR not in message
    settings = load_settings(None, api_keys=f"billing:{SECRET}", operator_keys=" op-1 ,op-2")
    assert settings.operator_key_list() == ("op-1", "op-2")
    assert "op-1" not in repr(settings) and "op-1" not in str(settings.model_dump())


def test_tenant_names_come_from_the_keys_and_cosyq_tenants() -> None:
    settings = load_settings(None, api_keys="billing:sk-1,sk-2", tenants="search, archive")
    assert settings.tenant_names() == ("default", "archive", "billing", "search")
    assert settings.api_key_list() == ("sk-1", "sk-2")
    with pytest.raises(SettingsError, match="COSYQ_TENANTS"):
        load_settings(None, tenants="ok,Not OK")


def test_quotas_default_and_per_tenant_overrides() -> None:
    settings = load_settings(
        None,
        tenant_max_queued_jobs=50,
        tenant_quotas={"billing": {"requests_per_minute": 3}},
    )
    assert (
        settings.max_queued_jobs("billing") == 50 and settings.requests_per_minute("billing") == 3
    )
    assert settings.requests_per_minute("search") == settings.tenant_requests_per_minute
    with pytest.raises(SettingsError, match=r"COSYQ_TENANT_QUOTAS: billing\.requests_per_hour"):
        load_settings(None, tenant_quotas={"billing": {"requests_per_hour": 3}})
    with pytest.raises(SettingsError, match=r"^invalid settings: COSYQ_TENANT_QUOTAS: a\.max_q"):
        load_settings(None, tenant_quotas={"a": {"max_queued_jobs": -1}})


@pytest.mark.parametrize("given", ["billing=5", ""])
def test_quotas_that_are_not_json_name_the_variable(
    given: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pydantic-settings' own message named the field and "EnvSettingsSource", not the variable
    monkeypatch.setenv("COSYQ_TENANT_QUOTAS", given)
    with pytest.raises(SettingsError) as caught:
        load_settings(None)
    assert str(caught.value).startswith("invalid settings: COSYQ_TENANT_QUOTAS: not valid JSON")


def test_queue_names_keep_the_old_names_for_default_and_priorities_first() -> None:
    names = tenants.queue_names(["beta", "default", "alpha"])
    assert names[:3] == (keys.QUEUE_HIGH, "cosyq-high.alpha", "cosyq-high.beta")
    assert names[3] == keys.QUEUE_DEFAULT and names[-1] == "cosyq-low.beta"
    assert tenants.queue_names(["default"]) == keys.QUEUES_IN_PRIORITY_ORDER
    assert [tenants.tenant_of_queue(n) for n in names[:3]] == ["default", "alpha", "beta"]
    assert tenants.tenant_queues("alpha") == (
        "cosyq-high.alpha",
        "cosyq-default.alpha",
        "cosyq-low.alpha",
    )


def test_rotation_stays_inside_one_priority() -> None:
    names = tenants.queue_names(["alpha", "beta"])
    groups = tenants.priority_groups(names)
    assert [len(group) for group in groups] == [3, 3, 3]
    default_group = groups[1]
    assert tenants.rotated_after(default_group, "cosyq-default.alpha") == [
        "cosyq-default.beta",
        keys.QUEUE_DEFAULT,
        "cosyq-default.alpha",
    ]
    assert tenants.rotated_after(groups[0], "cosyq-default.alpha") == groups[0]


def test_a_bad_tenant_name_is_an_unknown_tenant() -> None:
    for name in ("", "UPPER", "has.dot", "x" * 33, 7):
        with pytest.raises(UnknownTenantError):
            tenants.check_tenant_name(name)
