"""What `Settings` reads besides its own fields: `.env` files, every `COSYQ_*` name refused that
is not a setting (pydantic-settings would ignore a typo), and URLs shown without passwords."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dotenv import dotenv_values

from shared.errors import SettingsError

ENV_PREFIX = "COSYQ_"
# COSYQ_ variables that are not settings: read by scripts/ and the test harness only.
NON_SETTINGS_VARIABLES = frozenset(
    {
        "COSYQ_PYTHON",  # scripts/env.sh: the interpreter that creates .venv
        "COSYQ_REFERENCE_DIR",  # tests: the CosyVoice 2 reference set
        "COSYQ_REFERENCE3_DIR",  # tests: the CosyVoice 3 reference set
        "COSYQ_REQUIRE_REFERENCE",  # tests/CI: fail (not skip) when the reference set is missing
    }
)


def redact_url(url: str) -> str:
    """Replace the password in a URL (redis://user:secret@host) with ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    userinfo = f"{parts.username or ''}:***"
    host = parts.netloc.rsplit("@", 1)[1]
    return parts._replace(netloc=f"{userinfo}@{host}").geturl()


def read_env_files(env_file: Any) -> dict[str, str]:
    files: Iterable[Any]
    if env_file is None:
        files = ()
    elif isinstance(env_file, (str, Path)):
        files = (env_file,)
    else:
        files = env_file
    found: dict[str, str] = {}
    for file in files:
        if Path(file).is_file():
            found.update({k: v or "" for k, v in dotenv_values(file).items()})
    return found


def reject_unknown_variables(
    environ: Mapping[str, str], dotenv: Mapping[str, str], *, known: set[str]
) -> None:
    """Every COSYQ_ name that is not a setting (`known`) refused, with the closest suggested."""
    problems = []
    for source, names in (("environment", environ), (".env file", dotenv)):
        for name in sorted(names):
            upper = name.upper()
            if not upper.startswith(ENV_PREFIX) or upper in known:
                continue
            if upper in NON_SETTINGS_VARIABLES:
                continue
            close = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            problems.append(f"unknown setting {name} (from the {source}){hint}")
    if problems:
        raise SettingsError(
            "; ".join(problems) + " (README.md, Configuration, lists every setting)"
        )
