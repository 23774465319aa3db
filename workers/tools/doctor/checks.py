"""Every doctor check, in order: host, stack, services, model, then (unless --quick) run.

Settings are loaded once; when they are invalid that is the first ✗ and the checks that need
them are skipped with that reason, so the report still shows every row.
"""

from __future__ import annotations

import sys
from pathlib import Path

from shared.errors import SettingsError
from shared.settings import Settings, load_settings
from workers.tools.doctor import host_checks, model_checks, run_checks, service_checks, stack_checks
from workers.tools.doctor.host_checks import host_rows
from workers.tools.doctor.measure import RunOptions
from workers.tools.doctor.model_checks import model_rows
from workers.tools.doctor.rows import Row, Status, fail, ok, one_line, skip
from workers.tools.doctor.service_checks import service_rows
from workers.tools.doctor.stack_checks import stack_rows

SETTINGS_ROW = "settings"
ROW_NAMES = {  # every row of a report, by group, in order: each check module declares its own
    "host": (SETTINGS_ROW, *host_checks.ROW_NAMES),
    "stack": stack_checks.ROW_NAMES,
    "services": service_checks.ROW_NAMES,
    "model": model_checks.ROW_NAMES,
    "run": run_checks.ROW_NAMES,
}
NEED_SETTINGS = tuple((group, ROW_NAMES[group]) for group in ("services", "model", "run"))


def load_doctor_settings() -> Settings | SettingsError:
    """The settings, or the error that says which COSYQ_* variable is wrong."""
    try:
        return load_settings()
    except SettingsError as e:
        return e


def all_rows(
    settings: Settings | SettingsError,
    *,
    model_dir: Path | None,
    quick: bool,
    options: RunOptions,
    system: str = sys.platform,
) -> list[Row]:
    if isinstance(settings, SettingsError):
        rows = [
            fail(
                "host",
                SETTINGS_ROW,
                one_line(settings),
                "fix the named COSYQ_* variable (environment or .env)",
            )
        ]
        why = "the settings are invalid"
        rows += [skip("host", name, why) for name in host_checks.ROW_NAMES]
        rows += stack_rows(system=system)  # needs no settings
        rows += [skip(group, name, why) for group, names in NEED_SETTINGS for name in names]
        return rows
    return checked_rows(settings, model_dir=model_dir, quick=quick, options=options, system=system)


def checked_rows(
    settings: Settings,
    *,
    model_dir: Path | None,
    quick: bool,
    options: RunOptions,
    system: str = sys.platform,
) -> list[Row]:
    root = model_dir or settings.model_dir
    rows = [
        ok(
            "host",
            SETTINGS_ROW,
            f"backend {settings.backend}, device {settings.device}, model {root or '(none)'}",
        )
    ]
    rows += host_rows(settings, system=system)
    rows += stack_rows(system=system, device=settings.device)
    rows += service_rows(settings)
    model = model_rows(settings, root, system=system)
    rows += model
    loaded = model[0].status is Status.OK
    rows += run_checks.run_rows(
        settings, root, quick=quick, model_loaded=loaded, options=options, system=system
    )
    return rows
