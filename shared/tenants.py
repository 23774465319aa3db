"""Tenants: who a key belongs to, and the RQ queue each tenant's jobs wait in.

COSYQ_API_KEYS names each key's tenant (`billing:sk-...,search:sk-...`); a plain key (no colon)
belongs to the tenant "default", so the old form stays valid. Every tenant has its own RQ queue
per priority, `<priority queue>.<tenant>` (`cosyq-default.billing`), except "default", whose
queues keep their old names (`cosyq-default`): jobs queued before tenants existed still run.
Workers take the queues of one priority in rotating order (fair share), priorities first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from shared import keys
from shared.errors import SettingsError, UnknownTenantError

DEFAULT_TENANT = keys.DEFAULT_TENANT  # "default"
TENANT_META_KEY = "cosyq_tenant"  # job.meta: the tenant that submitted the job
TENANT_SEPARATOR = "."  # between a priority queue's name and a tenant's
TENANT_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")  # no '.', ':' or ',': they separate
TENANT_RULE = "1-32 lowercase letters, digits, '_' or '-', starting with a letter or digit"


@dataclass(frozen=True)
class ApiKey:
    """One accepted bearer key and its tenant (the key never appears in a repr)."""

    tenant: str
    secret: str = field(repr=False)


def check_tenant_name(name: object) -> str:
    """The name if it can name a tenant; UnknownTenantError otherwise."""
    if not isinstance(name, str) or not TENANT_RE.fullmatch(name):
        raise UnknownTenantError(f"tenant {name!r}: a tenant name is {TENANT_RULE}")
    return name


def parse_api_keys(raw: str) -> tuple[ApiKey, ...]:
    """COSYQ_API_KEYS as keys with tenants; SettingsError names the bad entry by position.

    Messages name the entry's position and tenant, never the key itself.
    """
    found: list[ApiKey] = []
    for position, raw_entry in enumerate(raw.split(","), start=1):
        entry = raw_entry.strip()
        if not entry:
            continue
        tenant, colon, secret = entry.partition(":") if ":" in entry else ("", "", entry)
        tenant, secret = tenant.strip(), secret.strip()
        where = f"COSYQ_API_KEYS entry {position}"
        if colon and not TENANT_RE.fullmatch(tenant):
            raise SettingsError(f"{where}: the tenant before ':' must be {TENANT_RULE}")
        if not secret or any(c.isspace() for c in secret):
            raise SettingsError(f"{where}: the key after the tenant is empty or holds spaces")
        if any(key.secret == secret for key in found):
            raise SettingsError(f"{where}: the same key as an earlier entry")
        found.append(ApiKey(tenant or DEFAULT_TENANT, secret))
    return tuple(found)


def parse_operator_keys(raw: str, api_keys: tuple[ApiKey, ...] = ()) -> tuple[str, ...]:
    """COSYQ_OPERATOR_KEYS as plain keys; SettingsError names the bad entry by position, never
    the key. An operator key may not also be a tenant key (which rights would it carry?)."""
    found: list[str] = []
    for position, raw_entry in enumerate(raw.split(","), start=1):
        secret = raw_entry.strip()
        if not secret:
            continue
        where = f"COSYQ_OPERATOR_KEYS entry {position}"
        if any(c.isspace() for c in secret):
            raise SettingsError(f"{where}: the key holds spaces")
        if secret in found:
            raise SettingsError(f"{where}: the same key as an earlier entry")
        if any(key.secret == secret for key in api_keys):
            raise SettingsError(f"{where}: the same key as an entry of COSYQ_API_KEYS")
        found.append(secret)
    return tuple(found)


def queue_name(priority_queue: str, tenant: str) -> str:
    """The RQ queue of one tenant at one priority (`cosyq-high` + `billing`)."""
    if tenant == DEFAULT_TENANT:
        return priority_queue
    return priority_queue + TENANT_SEPARATOR + tenant


def tenant_of_queue(name: str) -> str:
    """The tenant whose jobs a queue holds ("default" for a queue without a tenant part)."""
    _, separator, tenant = name.partition(TENANT_SEPARATOR)
    return tenant if separator else DEFAULT_TENANT


def priority_of_queue(name: str) -> str:
    """The priority queue a tenant queue belongs to (`cosyq-high.billing` -> `cosyq-high`)."""
    return name.partition(TENANT_SEPARATOR)[0]


def queue_names(tenants: Iterable[str]) -> tuple[str, ...]:
    """Every tenant's queues, priority by priority ("default" first within each)."""
    ordered = sorted(set(tenants) - {DEFAULT_TENANT})
    return tuple(
        queue_name(base, tenant)
        for base in keys.QUEUES_IN_PRIORITY_ORDER
        for tenant in (DEFAULT_TENANT, *ordered)
    )


def tenant_queues(tenant: str) -> tuple[str, ...]:
    """One tenant's queues in priority order (what its queued-jobs quota counts)."""
    return tuple(queue_name(base, tenant) for base in keys.QUEUES_IN_PRIORITY_ORDER)


def priority_groups(names: Sequence[str]) -> list[list[str]]:
    """Queue names split into runs of one priority, order kept (the unit of fair share)."""
    groups: list[list[str]] = []
    for name in names:
        if groups and priority_of_queue(groups[-1][0]) == priority_of_queue(name):
            groups[-1].append(name)
        else:
            groups.append([name])
    return groups


def rotated_after(group: Sequence[str], taken: str) -> list[str]:
    """A priority group turned so the queue after `taken` comes first and `taken` last."""
    if taken not in group:
        return list(group)
    at = list(group).index(taken) + 1
    return [*group[at:], *group[:at]]
