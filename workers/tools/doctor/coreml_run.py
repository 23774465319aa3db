"""Core ML run rows (macOS): cold compile and warm load, each compute unit against the
torch-cpu reference, and the compute plan (how many ops land on the ANE, GPU and CPU).

Everything compiles into a temporary cache, so the cold compile is really cold and the
worker's own cache (`COSYQ_COREML_CACHE_DIR`) is neither read nor written. Elsewhere every row
is skipped with the reason: Core ML has no runtime off macOS.
"""

from __future__ import annotations

import gc
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from shared.settings import Settings
from workers.coreml.platform import COMPUTE_UNITS_DEVICE
from workers.service.backend import coreml_dir_for, coreml_problem
from workers.tools.doctor.host_checks import MACOS_COMPUTE_PLAN, macos_version
from workers.tools.doctor.measure import (
    RUN_HINT,
    BackendFigures,
    PeakRss,
    Reference,
    RunOptions,
    compare,
    seed_table,
    stage_outputs,
)
from workers.tools.doctor.rows import COREML_ONLY_ON_MACOS, Row, fail, ok, one_line, skip

GROUP = "run"
UNITS = ("ALL", "CPU_AND_GPU", "CPU_AND_NE")
COMPILE_ROW = "Core ML cold compile and warm load"
PLAN_ROW = "Core ML compute plan (ops on ANE / GPU / CPU)"
ROW_NAMES = (COMPILE_ROW, *(f"Core ML {units}" for units in UNITS), PLAN_ROW)
DEVICE_NAMES = {
    "MLNeuralEngineComputeDevice": "ANE",
    "MLGPUComputeDevice": "GPU",
    "MLCPUComputeDevice": "CPU",
}


def coreml_rows(
    settings: Settings,
    root: Path,
    reference: Reference,
    options: RunOptions,
    *,
    system: str = sys.platform,
) -> list[Row]:
    if system != "darwin":
        return [skip(GROUP, name, COREML_ONLY_ON_MACOS) for name in ROW_NAMES]
    problem = coreml_problem(settings, root)
    if problem is not None:
        return [skip(GROUP, name, problem) for name in ROW_NAMES]
    folder = coreml_dir_for(settings, root)
    with tempfile.TemporaryDirectory(prefix="cosyq-doctor-") as scratch:
        cache = Path(scratch)
        known = settings.coreml_cache_dir / "hashes"  # checkpoint hashes, not compiled models:
        if known.is_dir():  # the cold compile should not time rehashing 2.5 GB of weights
            shutil.copytree(known, cache / "hashes")
        compile_row = _compile_row(root, folder, cache)
        if compile_row.status.value != "ok":
            why = "the conversion did not compile and load"
            return [compile_row, *(skip(GROUP, name, why) for name in ROW_NAMES[1:])]
        rows = [compile_row]
        for units in UNITS:
            rows.append(
                _units_row(
                    settings,
                    root,
                    folder=folder,
                    cache=cache,
                    units=units,
                    reference=reference,
                    options=options,
                )
            )
        rows.append(plan_row(cache / "compiled"))
    return rows


def _load(root: Path, folder: Path, cache: Path, units: str) -> Any:
    from workers.coreml.loader import load_coreml_stages  # noqa: PLC0415 (macOS, coremltools)

    return load_coreml_stages(root, coreml_dir=folder, cache_dir=cache, compute_units=units)


def _compile_row(root: Path, folder: Path, cache: Path) -> Row:
    try:
        start = time.perf_counter()
        _load(root, folder, cache, "ALL")
        cold = time.perf_counter() - start
        gc.collect()
        start = time.perf_counter()
        _load(root, folder, cache, "ALL")
        warm = time.perf_counter() - start
    except Exception as e:
        return fail(
            GROUP,
            COMPILE_ROW,
            one_line(e),
            "convert again (cosyq-worker convert), then " + RUN_HINT,
        )
    gc.collect()
    return ok(
        GROUP,
        COMPILE_ROW,
        f"cold {cold:.1f} s (compile + load, ALL), warm {warm:.1f} s (from the compile cache)",
        cold_s=round(cold, 3),
        warm_s=round(warm, 3),
    )


def _units_row(
    settings: Settings,
    root: Path,
    *,
    folder: Path,
    cache: Path,
    units: str,
    reference: Reference,
    options: RunOptions,
) -> Row:
    from workers.coreml.engine import CoreMLPlacement, coreml_engine  # noqa: PLC0415
    from workers.engine.pipeline import EngineOptions  # noqa: PLC0415

    name = f"Core ML {units}"
    placement = CoreMLPlacement("cpu", COMPUTE_UNITS_DEVICE[units], units, folder)
    try:
        with PeakRss().running() as rss:
            start = time.perf_counter()
            stages = _load(root, folder, cache, units)
            stages.warm_up()
            engine = coreml_engine(
                root,
                placement,
                stages,
                options=EngineOptions(forced_speech_tokens=options.tokens),
                hash_cache_dir=settings.hash_cache_dir,
            )
            load_s = time.perf_counter() - start
            outputs = stage_outputs(engine, reference.inputs, options.runs)
            first, mean = seed_table(engine, reference.inputs, options.runs)
    except Exception as e:
        chosen = settings.backend != "torch" and settings.compute_units == units
        return fail(GROUP, name, one_line(e), RUN_HINT, required=chosen)
    del engine, stages
    gc.collect()
    stages_figures = compare(outputs, reference.outputs)
    figures = BackendFigures(name, load_s, first, mean, rss.gb, stages_figures)
    return ok(GROUP, name, figures.line(), **figures.as_dict())


def plan_row(compiled: Path, *, version: tuple[int, ...] | None = None) -> Row:
    version = macos_version() if version is None else version
    if not version or version < MACOS_COMPUTE_PLAN:
        return skip(GROUP, PLAN_ROW, "MLComputePlan needs macOS 14.4 or later")
    try:
        counts = {
            path.name: compute_plan_counts(path) for path in sorted(compiled.rglob("*.mlmodelc"))
        }
    except Exception as e:
        return fail(GROUP, PLAN_ROW, one_line(e), RUN_HINT, required=False)
    shown = "; ".join(
        f"{name.removesuffix('.mlmodelc')}: " + ", ".join(f"{d} {n}" for d, n in sorted(c.items()))
        for name, c in counts.items()
    )
    return ok(GROUP, PLAN_ROW, f"compute units ALL: {shown}", ops=counts)


def compute_plan_counts(compiled: Path, units: str = "ALL") -> dict[str, int]:
    """How many operations of a compiled ML program Core ML prefers to run on each device."""
    from workers.coreml.convert.compat import load_coremltools  # noqa: PLC0415

    ct = load_coremltools()
    from coremltools.models.compute_plan import MLComputePlan  # noqa: PLC0415

    plan = MLComputePlan.load_from_path(str(compiled), compute_units=ct.ComputeUnit[units])
    program = plan.model_structure.program
    if program is None:
        raise ValueError(f"{compiled}: not an ML program")
    counts: Counter[str] = Counter()
    for function in program.functions.values():
        for operation in _operations(function.block):
            usage = plan.get_compute_device_usage_for_mlprogram_operation(operation)
            if usage is not None:
                kind = type(usage.preferred_compute_device).__name__
                counts[DEVICE_NAMES.get(kind, kind)] += 1
    return dict(counts)


def _operations(block: Any) -> list[Any]:
    """Every operation of a block, nested blocks (loops, conditionals) included."""
    found = []
    for operation in block.operations:
        found.append(operation)
        for inner in operation.blocks:
            found.extend(_operations(inner))
    return found
