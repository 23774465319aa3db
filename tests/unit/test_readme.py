"""The README's configuration table stays in step with Settings, and names no unknown variable."""

from __future__ import annotations

import re
from pathlib import Path

from shared.settings import Settings
from shared.settings_env import ENV_PREFIX, NON_SETTINGS_VARIABLES

README = Path(__file__).resolve().parents[2] / "README.md"


def test_every_setting_is_in_the_configuration_table() -> None:
    text = README.read_text()
    missing = [
        ENV_PREFIX + name.upper()
        for name in Settings.model_fields
        if f"| `{ENV_PREFIX}{name.upper()}` |" not in text
    ]
    assert missing == [], "run scripts/settings_table.py and update README.md"


def test_readme_names_only_real_variables() -> None:
    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields} | NON_SETTINGS_VARIABLES
    named = set(re.findall(r"COSYQ_[A-Z0-9_]+", README.read_text()))
    assert named - known == set()
