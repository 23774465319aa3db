"""A loaded, warmed engine from the factory `COSYQ_ENGINE` names, or one clear error.

`COSYQ_ENGINE` is "module:factory" (operator configuration, trusted). The product default is
`workers.service.default_engine:engine_from_settings`; tests point the setting at the engines in
tests/doubles. Importing this module loads no torch, so a test engine starts fast. Whatever goes
wrong while loading becomes a ModelLoadError with the setting and
the cause in its message, so the worker exits non-zero with one clear line instead of taking
jobs it cannot run.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from shared.errors import ModelLoadError, SettingsError
from shared.settings import Settings
from workers.engine.api import SynthesisEngine
from workers.engine.quality import import_measures

EngineFactory = Callable[[Settings], SynthesisEngine]


@dataclass(frozen=True)
class LoadedEngine:
    engine: SynthesisEngine
    load_s: float
    warm_up_s: float
    imports_s: float = 0.0  # the quality measures' first-use imports, done before ready


def import_engine_factory(spec: str) -> EngineFactory:
    """Resolve "package.module:factory" to the factory callable."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise ModelLoadError(f"COSYQ_ENGINE must look like 'package.module:factory', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ModelLoadError(f"COSYQ_ENGINE={spec}: cannot import {module_name}: {e}") from e
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ModelLoadError(f"COSYQ_ENGINE={spec}: {module_name} has no callable {attribute!r}")
    return cast(EngineFactory, factory)


def load_engine(settings: Settings) -> LoadedEngine:
    """Build the engine and run its warm-up, then import what a first job would import on first
    use (COSYQ_QUALITY_IMPORT_AT_START); every failure of the engine is a ModelLoadError."""
    factory = import_engine_factory(settings.engine)
    started = time.perf_counter()
    try:
        engine = factory(settings)
    except (ModelLoadError, SettingsError):  # already one clear line
        raise
    except Exception as e:
        raise ModelLoadError(
            f"COSYQ_ENGINE={settings.engine} failed to load: {type(e).__name__}: {e}"
        ) from e
    loaded = time.perf_counter()
    try:
        engine.warm_up()
    except Exception as e:
        raise ModelLoadError(
            f"COSYQ_ENGINE={settings.engine} loaded but its warm-up failed: {type(e).__name__}: {e}"
        ) from e
    warmed = time.perf_counter()
    imports_s = 0.0
    if settings.quality_import_at_start:
        import_measures()
        imports_s = time.perf_counter() - warmed
    return LoadedEngine(
        engine, load_s=loaded - started, warm_up_s=warmed - loaded, imports_s=imports_s
    )
