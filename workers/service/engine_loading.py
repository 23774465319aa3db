"""Settings -> a loaded, warmed engine: the one place the worker's settings reach the engine.

`COSYQ_ENGINE` is "module:factory" (operator configuration, trusted). The product default,
`engine_from_settings`, picks the backend and device (`backend.select_backend`) and maps the
settings onto the engine's plain options; tests point the setting at the engines in
tests/support. Whatever goes wrong while loading becomes a ModelLoadError with the setting and
the cause in its message, so the worker exits non-zero with one clear line instead of taking
jobs it cannot run.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from shared.errors import ModelLoadError
from shared.settings import Settings
from workers.engine.api import SynthesisEngine
from workers.engine.assembly import JoinConfig
from workers.engine.pipeline import EngineOptions, build_engine
from workers.engine.text_split import SplitConfig
from workers.service.backend import select_backend

EngineFactory = Callable[[Settings], SynthesisEngine]


@dataclass(frozen=True)
class LoadedEngine:
    engine: SynthesisEngine
    load_s: float
    warm_up_s: float


def engine_options(settings: Settings) -> EngineOptions:
    """The engine's per-engine choices, from the worker's settings."""
    return EngineOptions(
        normalize_text=settings.normalize_text,
        split=SplitConfig(max_piece_tokens=settings.max_piece_tokens),
        join=JoinConfig(gap_s=settings.piece_gap_ms / 1000),
        max_prompt_seconds=settings.max_prompt_seconds,
        max_speech_seconds=settings.max_speech_seconds,
    )


def engine_from_settings(settings: Settings) -> SynthesisEngine:
    """The default `COSYQ_ENGINE`: torch or Core ML, as `select_backend` decides."""
    if settings.model_dir is None:
        raise ModelLoadError(
            "COSYQ_MODEL_DIR is not set: point it at a CosyVoice2-0.5B folder "
            "(or write a test model with `cosyq-worker model init-tiny DIR`)"
        )
    choice = select_backend(settings, settings.model_dir)  # Linux + coreml: the one-line refusal
    options = engine_options(settings)
    if choice.backend == "coreml":  # macOS with a valid conversion; coremltools loads only here
        from workers.coreml.engine import CoreMLPlacement, load_coreml_engine  # noqa: PLC0415

        if choice.coreml_dir is None or choice.compute_units is None:
            raise ModelLoadError(f"Core ML was chosen without a conversion: {choice.reason}")
        placement = CoreMLPlacement(
            torch_device=choice.torch_device,
            reported_device=choice.device,
            compute_units=choice.compute_units,
            coreml_dir=choice.coreml_dir,
        )
        return load_coreml_engine(
            settings.model_dir,
            placement,
            cache_dir=settings.coreml_cache_dir,
            compile_timeout_s=settings.coreml_compile_timeout_s,
            dtype=settings.dtype,
            options=options,
            hash_cache_dir=settings.hash_cache_dir,
        )
    return build_engine(
        settings.model_dir,
        device=choice.device,
        dtype=settings.dtype,
        options=options,
        hash_cache_dir=settings.hash_cache_dir,
    )


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
    """Build the engine and run its warm-up; every failure is a ModelLoadError."""
    factory = import_engine_factory(settings.engine)
    started = time.perf_counter()
    try:
        engine = factory(settings)
    except ModelLoadError:
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
    return LoadedEngine(
        engine=engine, load_s=loaded - started, warm_up_s=time.perf_counter() - loaded
    )
