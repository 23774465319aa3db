"""Every numeric setting has a ceiling (and a floor): a huge value (1e300, inf, a byte count
given for megabytes) is refused at load in one line naming the variable and its bound, where it
reached socket timeouts, thread waits and time arithmetic later as an OverflowError."""

from __future__ import annotations

import math
import typing

import annotated_types
import pytest
from pydantic.fields import FieldInfo

from shared.errors import SettingsError
from shared.settings import Settings, load_settings
from shared.settings_bounds import CEILINGS, FLOORS, spelled
from shared.settings_tenants import TenantQuota

pytestmark = pytest.mark.usefixtures("clean_env")  # tests/unit/conftest.py


def _numeric(field: FieldInfo) -> bool:
    kinds = set(typing.get_args(field.annotation)) or {field.annotation}
    return bool(kinds & {int, float}) and bool not in kinds


NUMERIC = sorted(name for name, field in Settings.model_fields.items() if _numeric(field))


def _own(field: FieldInfo, *kinds: type) -> list[float]:
    found = []
    for item in field.metadata:
        if isinstance(item, kinds):
            found.extend(getattr(item, k) for k in ("le", "lt", "ge", "gt") if hasattr(item, k))
    return found


def _ceiling(name: str) -> float:
    own = _own(Settings.model_fields[name], annotated_types.Le, annotated_types.Lt)
    return CEILINGS.get(name, min(own, default=math.inf))


def test_every_numeric_setting_has_a_ceiling_and_a_floor() -> None:
    no_ceiling = [name for name in NUMERIC if math.isinf(_ceiling(name))]
    no_floor = [
        name
        for name in NUMERIC
        if name not in FLOORS
        and not _own(Settings.model_fields[name], annotated_types.Ge, annotated_types.Gt)
    ]
    assert (no_ceiling, no_floor) == ([], []), "name it in shared/settings_bounds.py"
    assert set(CEILINGS) | set(FLOORS) <= set(NUMERIC), "a bound for no numeric setting"


def test_a_tenant_quota_has_the_ceiling_of_its_default() -> None:
    for name, field in TenantQuota.model_fields.items():
        if _numeric(field):
            assert _own(field, annotated_types.Le) == [CEILINGS[f"tenant_{name}"]], name


@pytest.mark.parametrize("name", NUMERIC)
def test_a_value_past_the_ceiling_is_refused_in_one_line(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    kind = Settings.model_fields[name].annotation
    huge = "1e300" if float in (set(typing.get_args(kind)) or {kind}) else "9" * 30
    monkeypatch.setenv(f"COSYQ_{name.upper()}", huge)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith(f"invalid settings: COSYQ_{name.upper()}: "), message
    assert "\n" not in message
    if name in CEILINGS:
        bound = CEILINGS[name]
        shown = int(bound) if float(bound).is_integer() else bound
        assert f"less than or equal to {shown}{spelled(name, bound)} (got" in message


@pytest.mark.parametrize("value", ["inf", "nan", "1e300"])
def test_an_endless_timeout_is_refused(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSYQ_REDIS_CONNECT_TIMEOUT_S", value)
    with pytest.raises(SettingsError, match="COSYQ_REDIS_CONNECT_TIMEOUT_S: Input should be"):
        load_settings()


def test_a_value_at_the_ceiling_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSYQ_REDIS_CONNECT_TIMEOUT_S", str(CEILINGS["redis_connect_timeout_s"]))
    monkeypatch.setenv("COSYQ_RESULT_TTL_S", str(CEILINGS["result_ttl_s"]))
    settings = load_settings()
    assert settings.redis_connect_timeout_s == CEILINGS["redis_connect_timeout_s"]
    assert settings.result_ttl_s == CEILINGS["result_ttl_s"]


def test_a_floor_refuses_minus_infinity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSYQ_QUALITY_SILENCE_DBFS", "-inf")
    with pytest.raises(SettingsError, match=r"COSYQ_QUALITY_SILENCE_DBFS: .* greater than or eq"):
        load_settings()


def test_a_tenant_quota_past_its_ceiling_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSYQ_TENANT_QUOTAS", '{"billing": {"max_waits": 10000000}}')
    with pytest.raises(SettingsError, match=r"COSYQ_TENANT_QUOTAS: billing\.max_waits: Input"):
        load_settings()


@pytest.mark.parametrize(
    ("name", "bound", "words"),
    [
        ("redis_connect_timeout_s", 600, " (10 minutes)"),
        ("result_ttl_s", 366 * 86400, " (366 days)"),
        ("cancel_check_ms", 3_600_000, " (1 hour)"),
        ("webhook_retry_hours", 24, " (1 day)"),
        ("max_jobs", 10, ""),
    ],
)
def test_a_duration_bound_is_spelled_out(name: str, bound: float, words: str) -> None:
    assert spelled(name, bound) == words
