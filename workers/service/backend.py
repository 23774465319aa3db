"""Which backend and device a worker runs on (`COSYQ_BACKEND`, `COSYQ_DEVICE`).

- `coreml`: macOS only (elsewhere one line: "Core ML runs only on macOS; use
  COSYQ_BACKEND=torch"), and only with a valid conversion: a readable manifest of the model
  directory's family, every stage, and checkpoints that hash as they did at conversion time.
  Anything else is a ModelLoadError.
- `torch`: the device from `COSYQ_DEVICE`; `auto` picks MPS, else CUDA, else CPU.
- `auto`: Core ML on macOS when a valid conversion is present, else torch as above; `reason`
  says why, including what was wrong with the conversion that was passed over.
Stages that stay on PyTorch under Core ML (the LLM, the prompt front end) use `torch_device`.
Nothing here imports coremltools or loads a model; the checkpoint hashes are cached by file
size and mtime, so a recycled worker does not re-read 2.5 GB.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from shared.errors import ModelLoadError
from shared.settings import Settings
from workers.coreml.manifest import check_family, check_sources, read_manifest
from workers.coreml.platform import COMPUTE_UNITS_DEVICE, COREML_SUBDIR, MACOS_ONLY
from workers.coreml.stages import ALL_STAGES
from workers.engine.devices import available_devices, resolve_device
from workers.model.directory import ModelDirectory


@dataclass(frozen=True)
class BackendChoice:
    """The chosen backend, its device, and why (logged in worker_ready)."""

    backend: str  # "torch" | "coreml"
    device: str  # torch device, or the Core ML compute units as "ane/gpu/cpu", ...
    reason: str
    torch_device: str = "cpu"  # where PyTorch stages run (the LLM under Core ML)
    compute_units: str | None = None  # Core ML only
    coreml_dir: Path | None = None  # Core ML only


def coreml_dir_for(settings: Settings, model_dir: Path) -> Path:
    """COSYQ_COREML_DIR, else `<model_dir>/coreml`."""
    return settings.coreml_dir or model_dir / COREML_SUBDIR


def select_backend(
    settings: Settings,
    model_dir: Path,
    *,
    platform: str = sys.platform,
    torch_devices: Callable[[], set[str]] = available_devices,
) -> BackendChoice:
    """Apply the rules in the module docstring; ModelLoadError when they cannot be met."""
    if settings.backend == "coreml" and platform != "darwin":
        raise ModelLoadError(MACOS_ONLY)
    passed_over = ""
    if settings.backend in ("coreml", "auto") and platform == "darwin":
        problem = coreml_problem(settings, model_dir)
        if problem is None:
            return _coreml_choice(settings, model_dir, torch_devices())
        if settings.backend == "coreml":
            raise ModelLoadError(f"COSYQ_BACKEND=coreml: {problem}")
        passed_over = f"; Core ML passed over: {problem}"
    device = str(resolve_device(settings.device, torch_devices()))
    origin = "COSYQ_BACKEND=torch" if settings.backend == "torch" else "auto"
    how = f"COSYQ_DEVICE={settings.device}" if settings.device != "auto" else "best available"
    return BackendChoice("torch", device, f"{origin}: {device} ({how}){passed_over}", device)


def coreml_problem(settings: Settings, model_dir: Path) -> str | None:
    """Why the Core ML conversion cannot be used (None when it can)."""
    if importlib.util.find_spec("coremltools") is None:
        return "coremltools is not installed (pip install 'cosyq[coreml]')"
    folder = coreml_dir_for(settings, model_dir)
    try:
        manifest = read_manifest(folder)
        missing = [stage for stage in ALL_STAGES if stage not in manifest.packages]
        if missing:
            return f"{folder}: conversion lacks {', '.join(missing)}"
        check_family(manifest, ModelDirectory(model_dir).family)
        check_sources(manifest, model_dir, settings.coreml_cache_dir / "hashes")
    except ModelLoadError as e:
        return str(e)
    return None


def _coreml_choice(settings: Settings, model_dir: Path, devices: set[str]) -> BackendChoice:
    folder = coreml_dir_for(settings, model_dir)
    explicit = "compute_units" in settings.model_fields_set
    units = settings.compute_units if explicit else read_manifest(folder).compute_units
    source = "COSYQ_COMPUTE_UNITS" if explicit else "the conversion's default"
    origin = "COSYQ_BACKEND=coreml" if settings.backend == "coreml" else "auto"
    return BackendChoice(
        "coreml",
        COMPUTE_UNITS_DEVICE[units],
        f"{origin}: valid Core ML conversion at {folder}, compute units {units} ({source})",
        torch_device="mps" if "mps" in devices else "cpu",
        compute_units=units,
        coreml_dir=folder,
    )
