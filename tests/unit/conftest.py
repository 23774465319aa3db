"""Fixtures shared by the unit tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No COSYQ_ variable from the caller's shell (a setting changes what `load_settings`
    reads; any other COSYQ_ name, a typo or a test-only one, is refused or allowed by rules a
    test sets up itself), and the cwd a scratch folder without a .env; that folder."""
    for name in list(os.environ):
        if name.upper().startswith("COSYQ_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path
