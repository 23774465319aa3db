"""COSYQ_POOL_START: which way the pool starts a worker, and what its template imports."""

from __future__ import annotations

import pytest

from shared.errors import SettingsError
from shared.settings import Settings, load_settings
from workers.service.template import EXEC, QUALITY_MODULES, TEMPLATE, preload_modules, start_mode


def test_exec_is_the_default_everywhere() -> None:
    assert Settings().pool_start == EXEC
    assert start_mode(Settings(), platform="linux") == EXEC
    assert start_mode(Settings(), platform="darwin") == EXEC


def test_the_template_is_linux_only_and_macos_keeps_exec() -> None:
    chosen = Settings(pool_start="template")
    assert start_mode(chosen, platform="linux") == TEMPLATE
    assert start_mode(chosen, platform="darwin") == EXEC  # fork is unsafe after Core ML/Metal


def test_an_unknown_mode_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSYQ_POOL_START", "fork")
    with pytest.raises(SettingsError):
        load_settings()


def test_the_template_imports_the_worker_its_engine_and_the_measures_it_would_import() -> None:
    engine = "workers.service.default_engine:engine_from_settings"
    with_measures = preload_modules(engine, quality_imports=True)
    assert "workers.service.default_engine" in with_measures
    assert "wetext" in with_measures  # the default engine's normaliser, imported by its warm-up
    assert "workers.worker" in with_measures
    assert set(QUALITY_MODULES) <= set(with_measures)
    light = preload_modules("tests.doubles.engines:fast", quality_imports=False)
    assert "tests.doubles.engines" in light
    assert not set(QUALITY_MODULES) & set(light)  # as an exec start would: on first use
