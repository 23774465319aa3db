"""Run rows (unless --quick): the model through each backend on identical inputs.

torch-cpu fp32 is the reference every other backend is compared with; torch-mps and the Core
ML compute units (`coreml_run`) follow where this host has them, and are skipped with the
reason where it does not. Every row name is always present, so two hosts' reports line up.
"""

from __future__ import annotations

import gc
import sys
import time
from pathlib import Path

from shared.settings import Settings
from workers.engine.pipeline import EngineOptions, build_engine
from workers.service.host import limit_threads_after_load, physical_cores, threads_per_worker
from workers.tools.doctor import coreml_run
from workers.tools.doctor.measure import (
    RUN_HINT,
    BackendFigures,
    PeakRss,
    Reference,
    RunOptions,
    compare,
    reference_inputs,
    seed_table,
    stage_outputs,
)
from workers.tools.doctor.rows import Row, fail, ok, one_line, skip
from workers.tools.doctor.stack_checks import MPS_ONLY

GROUP = "run"
CPU_ROW = "torch-cpu fp32 (reference)"
MPS_ROW = "torch-mps fp32"
ROW_NAMES = (CPU_ROW, MPS_ROW, *coreml_run.ROW_NAMES)


def run_rows(
    settings: Settings,
    root: Path | None,
    *,
    quick: bool,
    model_loaded: bool,
    options: RunOptions,
    system: str = sys.platform,
) -> list[Row]:
    if quick:
        return [skip(GROUP, name, "--quick") for name in ROW_NAMES]
    if root is None or not model_loaded:
        return [skip(GROUP, name, "the model did not load") for name in ROW_NAMES]
    import torch  # noqa: PLC0415

    previous = torch.get_num_threads()
    limit_threads_after_load(
        threads_per_worker(settings.threads, settings.pool_size, physical_cores())
    )
    try:
        cpu_row, reference = _reference_row(settings, root, options)
        if reference is None:
            why = "the torch-cpu reference did not run"
            return [cpu_row, *(skip(GROUP, name, why) for name in ROW_NAMES[1:])]
        rows = [cpu_row, _mps_row(settings, root, reference, options, system)]
        rows += coreml_run.coreml_rows(settings, root, reference, options, system=system)
        return rows
    finally:
        torch.set_num_threads(previous)  # as it was (doctor may run inside a test process)


def _engine_options(options: RunOptions) -> EngineOptions:
    return EngineOptions(forced_speech_tokens=options.tokens)


def _reference_row(
    settings: Settings, root: Path, options: RunOptions
) -> tuple[Row, Reference | None]:
    try:
        with PeakRss().running() as rss:
            start = time.perf_counter()
            engine = build_engine(
                root,
                device="cpu",
                dtype="fp32",
                options=_engine_options(options),
                hash_cache_dir=settings.hash_cache_dir,
            )
            load_s = time.perf_counter() - start
            inputs = reference_inputs(engine, root, options.tokens, options.seed)
            outputs = stage_outputs(engine, inputs, options.runs)
            first, mean = seed_table(engine, inputs, options.runs)
    except Exception as e:  # any failure here is the news: report it, do not crash the report
        return fail(GROUP, CPU_ROW, one_line(e), RUN_HINT), None
    del engine
    gc.collect()
    figures = BackendFigures(
        "torch-cpu fp32", load_s, first, mean, rss.gb, compare(outputs, outputs)
    )
    return _figures_row(CPU_ROW, figures), Reference(inputs, outputs)


def _figures_row(name: str, figures: BackendFigures) -> Row:
    return ok(GROUP, name, figures.line(), **figures.as_dict())


def _mps_row(
    settings: Settings, root: Path, reference: Reference, options: RunOptions, system: str
) -> Row:
    if system != "darwin":
        return skip(GROUP, MPS_ROW, MPS_ONLY)
    import torch  # noqa: PLC0415

    if not torch.backends.mps.is_available():
        return skip(GROUP, MPS_ROW, "MPS is not available in this torch build or on this Mac")
    try:
        figures = measure_torch(settings, root, "mps", reference, options)
    except Exception as e:
        return fail(
            GROUP, MPS_ROW, one_line(e), RUN_HINT, required=settings.device.startswith("mps")
        )
    return _figures_row(MPS_ROW, figures)


def measure_torch(
    settings: Settings, root: Path, device: str, reference: Reference, options: RunOptions
) -> BackendFigures:
    """Load the model on a torch `device` and measure it against the reference."""
    with PeakRss().running() as rss:
        start = time.perf_counter()
        engine = build_engine(
            root,
            device=device,
            dtype="fp32",
            options=_engine_options(options),
            hash_cache_dir=settings.hash_cache_dir,
        )
        load_s = time.perf_counter() - start
        outputs = stage_outputs(engine, reference.inputs, options.runs)
        first, mean = seed_table(engine, reference.inputs, options.runs)
    del engine
    gc.collect()
    stages = compare(outputs, reference.outputs)
    return BackendFigures(f"torch-{device} fp32", load_s, first, mean, rss.gb, stages)
