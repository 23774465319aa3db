"""A model directory in, a folder of Core ML packages plus `manifest.json` out.

`convert_model_dir` loads flow.pt and hift.pt (and llm.pt for a macOS 15 target) of either
family (CosyVoice 2 or 3, as the directory's yaml says) through the production loaders,
converts each stage (`convert`, `llm_convert`), compresses the weights (`compress`), saves
every package and writes the manifest LAST, after removing any old one first: a folder whose
conversion was interrupted has no manifest, so no worker will load it.
"""

from __future__ import annotations

import datetime
import platform
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from shared.errors import ModelLoadError
from workers.coreml.convert.compat import (
    known_warnings_silenced,
    load_coremltools,
    release_temp_package,
)
from workers.coreml.convert.compress import compress_model
from workers.coreml.convert.llm_convert import convert_llm
from workers.coreml.convert.options import ConvertOptions
from workers.coreml.convert.stages_convert import (
    AnyFlow,
    AnyHiFT,
    ConvertedStage,
    convert_flow,
    convert_hift,
)
from workers.coreml.manifest import MANIFEST_FILE, Manifest, PackageEntry, package_sha256
from workers.coreml.stages import LLM, LLM_CHECKPOINT, LLM_PREFILL, llm_specs
from workers.model.causal_hift.model import build_causal_hift
from workers.model.checkpoint import read_state_dict
from workers.model.directory import ModelDirectory, file_sha256
from workers.model.dit.model import build_dit_flow
from workers.model.flow.model import CausalMaskedDiffWithXvec, build_flow
from workers.model.hift.model import HiFTGenerator, build_hift
from workers.model.llm.model import build_llm
from workers.model.loader import CosyVoice3Configs, family_configs

SOURCE_CHECKPOINTS = ("flow.pt", "hift.pt")
WEIGHTS_FILE = Path("Data/com.apple.CoreML/weights/weight.bin")
Progress = Callable[[str, float], None]  # (stage, seconds it took)


def load_stages(model_dir: Path, flow_steps: int | None = None) -> tuple[AnyFlow, AnyHiFT]:
    """flow.pt and hift.pt built from the directory's yaml (cosyvoice2.yaml: the U-Net flow and
    HiFT; cosyvoice3.yaml: the DiT flow and causal HiFT), float32 on CPU; the flow solves in
    `flow_steps` Euler steps (None: the model's own)."""
    directory = ModelDirectory(model_dir)
    if not directory.root.is_dir():
        raise ModelLoadError(f"{model_dir}: model directory not found")
    flow_path, hift_path = directory.checkpoint("flow"), directory.checkpoint("hift")
    configs = family_configs(directory)
    if flow_steps is not None:
        configs = configs.with_flow_steps(flow_steps)
    flow_state, hift_state = read_state_dict(flow_path), read_state_dict(hift_path, mmap=False)
    if isinstance(configs, CosyVoice3Configs):
        return (
            build_dit_flow(configs.flow, flow_state, source=flow_path),
            build_causal_hift(configs.hift, hift_state, source=hift_path),
        )
    flow = build_flow(configs.flow, flow_state, source=flow_path)
    return flow, build_hift(configs.hift, hift_state, source=hift_path)


def load_flow_and_hift(
    model_dir: Path, flow_steps: int | None = None
) -> tuple[CausalMaskedDiffWithXvec, HiFTGenerator]:
    """`load_stages` of a CosyVoice 2 directory (ModelLoadError for another family)."""
    flow, hift = load_stages(model_dir, flow_steps)
    if not isinstance(flow, CausalMaskedDiffWithXvec) or not isinstance(hift, HiFTGenerator):
        raise ModelLoadError(f"{model_dir}: not a CosyVoice 2 directory (use load_stages)")
    return flow, hift


def convert_modules(
    flow: AnyFlow,
    hift: AnyHiFT,
    options: ConvertOptions,
    progress: Progress | None = None,
) -> dict[str, ConvertedStage]:
    """Convert and compress every stage; `progress(step, seconds)` after each step."""
    report = progress or (lambda _step, _seconds: None)
    stages: dict[str, ConvertedStage] = {}
    for group, convert in (
        ("flow", lambda: convert_flow(flow, options)),
        ("hift", lambda: convert_hift(hift, options, max_frames=flow.config.cfm.noise_frames)),
    ):
        started = time.perf_counter()
        converted = convert()
        report(f"convert {group}", time.perf_counter() - started)
        for name, stage in converted.items():
            stage.compression = options.stage_compression(name)
            if stage.compression != "none":
                started = time.perf_counter()
                compressed = compress_model(stage.model, stage.compression, options.target)
                release_temp_package(stage.model)
                stage.model = compressed
                report(f"compress {name} ({stage.compression})", time.perf_counter() - started)
            stages[name] = stage
    return stages


def write_manifest(
    entries: dict[str, PackageEntry],
    out_dir: Path,
    *,
    options: ConvertOptions,
    sources: dict[str, str],
    model_name: str,
    flow_steps: int | None,
    family: str = "cosyvoice2",
) -> Manifest:
    """Write the manifest describing the packages already saved in `out_dir`; `flow_steps`:
    the Euler steps the CFM package was traced with (None: no flow package); `family`: the
    model directory's (cosyvoice2 or cosyvoice3)."""
    manifest = Manifest(
        model_name=model_name,
        family=family,
        source_checkpoints=sources,
        tools=tool_versions(),
        precision=options.precision,
        weights=options.weights,
        target=options.target,
        compute_units=options.compute_units,
        packages=entries,
        flow_steps=flow_steps,
        created_utc=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    manifest.write(out_dir)
    return manifest


def save_package(stage: ConvertedStage, out_dir: Path) -> PackageEntry:
    """Save one converted stage into `out_dir` (via a partial folder) and describe it."""
    final = out_dir / stage.spec.package
    partial = out_dir / f".partial-{stage.spec.package}"
    shutil.rmtree(partial, ignore_errors=True)
    with known_warnings_silenced():
        stage.model.save(str(partial))
    release_temp_package(stage.model)
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    return PackageEntry(
        stage=stage.spec.name,
        path=final.name,
        sha256=package_sha256(final),
        size_bytes=_size(final),
        weights_bytes=_size(final / WEIGHTS_FILE),
        precision=stage.precision,
        compression=stage.compression,
        inputs=stage.spec.inputs,
        outputs=stage.spec.outputs,
        dims=stage.dims,
        buckets=stage.buckets,
        batch_sizes=stage.batch_sizes,
    )


def tool_versions() -> dict[str, str]:
    return {
        "coremltools": str(load_coremltools().__version__),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
    }


def convert_model_dir(
    model_dir: Path,
    out_dir: Path,
    options: ConvertOptions,
    progress: Progress | None = None,
) -> Manifest:
    """Convert `model_dir` into `out_dir`; returns the manifest written.

    Flow and HiFT always; the LLM too when `options.converts_llm` (target macOS 15). Either
    family: the directory's yaml decides, and the manifest records which.
    """
    directory = ModelDirectory(model_dir)
    flow, hift = load_stages(model_dir, options.flow_steps)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MANIFEST_FILE).unlink(missing_ok=True)  # no manifest until every package is in
    sources = {name: file_sha256(directory.path(name)) for name in SOURCE_CHECKPOINTS}
    stages = convert_modules(flow, hift, options, progress)
    entries = {name: save_package(stage, out_dir) for name, stage in stages.items()}
    if options.converts_llm:
        started = time.perf_counter()
        entries[LLM] = convert_llm_package(directory, out_dir, options)
        sources[LLM_CHECKPOINT] = file_sha256(directory.path(LLM_CHECKPOINT))
        (progress or (lambda _step, _seconds: None))("convert llm", time.perf_counter() - started)
    return write_manifest(
        entries,
        out_dir,
        options=options,
        sources=sources,
        model_name=directory.name,
        flow_steps=flow.config.cfm.n_timesteps,
        family=directory.family,
    )


def convert_llm_package(
    directory: ModelDirectory, out_dir: Path, options: ConvertOptions
) -> PackageEntry:
    """llm.pt -> `llm.mlpackage` (prefill + decode, stateful), saved into `out_dir`."""
    path = directory.path(LLM_CHECKPOINT)
    config = family_configs(directory).llm  # CosyVoice 3: its 6761-row head, no bias
    llm = build_llm(config, read_state_dict(path), source=path, kernel="torch")
    final = out_dir / f"{LLM}.mlpackage"
    partial = out_dir / f".partial-{LLM}.mlpackage"
    shutil.rmtree(partial, ignore_errors=True)
    converted = convert_llm(llm, options, partial, capacity=options.llm_capacity)
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    specs = llm_specs(config.backbone.hidden_size, config.decoder_size)
    return PackageEntry(
        stage=LLM,
        path=final.name,
        sha256=package_sha256(final),
        size_bytes=_size(final),
        weights_bytes=_size(final / WEIGHTS_FILE),
        precision=converted.precision,
        compression=converted.compression,
        inputs=specs[LLM_PREFILL].inputs,
        outputs=specs[LLM_PREFILL].outputs,
        dims=converted.dims,
        functions={name: spec.inputs for name, spec in specs.items()},
        states=converted.states,
    )


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
