"""The quantization experiment behind `cosyq-worker bench quantization` (`quantization_bench`).

Package size and output quality per weight format.

For each variant (fp32, fp16, int8 per-channel, int8 per-block, palettized 6-bit and 4-bit) the
flow and HiFT are converted (fp32 and fp16 once each, the rest compressed from fp16), saved to
measure their size, decompressed and run in PyTorch on one fixed request (`quality`). Every
variant targets macOS 15, which per-block int8 needs, so rows compare like with like. On macOS
the packages are also run through Core ML (`run_on_core_ml`): first call, mean over R runs,
peak RSS, and the SNR of the Core ML waveform itself.

Models: `--model-dir` (any model directory), or `--reference DIR --size tiny` (the reference
set's tiny checkpoints) or `--size full` (the FULL architecture with random weights). Random
weights say nothing about real-weight quality: rows compare formats with each other only.
"""

from __future__ import annotations

import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workers.coreml.convert.build import WEIGHTS_FILE, load_flow_and_hift
from workers.coreml.convert.compat import (
    known_warnings_silenced,
    load_coremltools,
    release_temp_package,
)
from workers.coreml.convert.compress import compress_model, decompressed_weights
from workers.coreml.convert.options import ConvertOptions
from workers.coreml.convert.stages_convert import (
    ConvertedStage,
    convert_flow,
    convert_hift,
)
from workers.coreml.runtime import CoreMLFlow, CoreMLHiFT
from workers.coreml.stages import HIFT_SOURCE
from workers.model.checkpoint import read_state_dict
from workers.model.directory import ModelDirectory
from workers.model.features import MelConfig
from workers.model.flow.model import CausalMaskedDiffWithXvec, build_flow
from workers.model.hift.model import HiFTGenerator, build_hift
from workers.tools.bench.coreml_quality import (
    BenchRequest,
    Quality,
    bench_request,
    measure,
    snr_db,
    synthesize,
    variant_modules,
)
from workers.tools.fixtures.random_weights import random_flow, random_full_hift
from workers.tools.reference.configs import (
    flow_config_from_reference,
    hift_config_from_reference,
    mel_config_from_reference,
)
from workers.tools.reference.parity import ReferenceSet

RANDOM_F0_HZ = 150.0  # random f0 weights leave every frame unvoiced; bias them to voiced


@dataclass(frozen=True)
class Subject:
    """The model under test."""

    name: str
    flow: CausalMaskedDiffWithXvec
    hift: HiFTGenerator
    mel_config: MelConfig


@dataclass(frozen=True)
class VariantRow:
    variant: str
    package_bytes: int
    weights_bytes: int
    quality: Quality
    prepare_s: float  # conversion (fp32/fp16) or compression time
    core_ml: dict[str, float] | None = None  # macOS: first_s, mean_s, peak_rss_mb, snr_db


def subject_from_model_dir(path: Path) -> Subject:
    flow, hift = load_flow_and_hift(path)
    return Subject(path.name, flow, hift, MelConfig.from_model_yaml(ModelDirectory(path).yaml))


def subject_from_reference(root: Path, size: str, seed: int = 0) -> Subject:
    """`tiny`: the reference checkpoints; `full`: the FULL architecture, random weights."""
    ref = ReferenceSet(root)
    flow_cfg, hift_cfg = (
        flow_config_from_reference(ref.config, size),
        hift_config_from_reference(ref.config, size),
    )
    if size == "tiny":
        flow = build_flow(flow_cfg, read_state_dict(ref.checkpoint("flow")))
        hift = build_hift(hift_cfg, read_state_dict(ref.checkpoint("hift")))
    else:
        flow, hift = random_flow(flow_cfg, seed=seed), random_full_hift(hift_cfg, seed=seed)
        with torch.no_grad():
            hift.f0_predictor.classifier.bias.fill_(RANDOM_F0_HZ)
    return Subject(f"{size} ({root.name})", flow, hift, mel_config_from_reference(ref.config))


def _convert_all(subject: Subject, precision: str, target: str) -> dict[str, ConvertedStage]:
    options = ConvertOptions(precision=precision, target=target, batch_sizes=(1,))  # batch 1
    flow_stages = convert_flow(subject.flow, options)
    max_frames = subject.flow.config.cfm.noise_frames
    return {**flow_stages, **convert_hift(subject.hift, options, max_frames=max_frames)}


def _variant_models(
    variant: str, converted: dict[str, dict[str, ConvertedStage]], target: str
) -> dict[str, Any]:
    if variant in ("fp32", "fp16"):
        return {name: stage.model for name, stage in converted[variant].items()}
    return {
        name: stage.model if name == HIFT_SOURCE else compress_model(stage.model, variant, target)
        for name, stage in converted["fp16"].items()
    }


def _save_sizes(models: dict[str, Any], folder: Path) -> tuple[int, int]:
    """Save the packages into `folder`; (total bytes, weight-file bytes)."""
    total = weights = 0
    for name, model in models.items():
        path = folder / f"{name}.mlpackage"
        with known_warnings_silenced():
            model.save(str(path))
        total += sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        weights += (path / WEIGHTS_FILE).stat().st_size
    return total, weights


def run_variants(
    subject: Subject,
    variants: tuple[str, ...],
    *,
    tokens: int,
    prompt_tokens: int,
    seed: int,
    runs: int,
    target: str,
    progress: Callable[[str], None] = lambda _line: None,
) -> list[VariantRow]:
    """One row per variant, in the order given."""
    request = bench_request(subject.flow, subject.hift, tokens, prompt_tokens, seed)
    reference = synthesize(subject.flow, subject.hift, request)
    converted: dict[str, dict[str, ConvertedStage]] = {}
    convert_s: dict[str, float] = {}
    for precision in ("fp32", "fp16"):
        if precision in variants or (precision == "fp16" and set(variants) - {"fp32"}):
            started = time.perf_counter()
            converted[precision] = _convert_all(subject, precision, target)
            convert_s[precision] = time.perf_counter() - started
            progress(f"converted {precision} in {convert_s[precision]:.1f} s")
    rows = []
    with tempfile.TemporaryDirectory(prefix="cosyq-quant-") as tmp:
        for variant in variants:
            started = time.perf_counter()
            models = _variant_models(variant, converted, target)
            prepare_s = convert_s.get(variant, time.perf_counter() - started)
            folder = Path(tmp) / variant
            folder.mkdir()
            size, weights = _save_sizes(models, folder)
            loaded = {stage: decompressed_weights(model) for stage, model in models.items()}
            flow_v, hift_v, cover = variant_modules(subject.flow, subject.hift, loaded)
            quality = measure(
                reference, flow_v, hift_v, request=request, mel_config=subject.mel_config,
                weight_coverage=cover,
            )  # fmt: skip
            core_ml = None
            if sys.platform == "darwin":
                core_ml = run_on_core_ml(subject, folder, request, reference[1], runs)
            rows.append(VariantRow(variant, size, weights, quality, prepare_s, core_ml))
            progress(f"{variant}: SNR {quality.snr_db:.1f} dB")
            if variant not in ("fp32", "fp16"):  # compressed copies; keep the fp16 originals
                for name, model in models.items():
                    if model is not converted["fp16"][name].model:
                        release_temp_package(model)
            shutil.rmtree(folder)
    return rows


def run_on_core_ml(
    subject: Subject, folder: Path, request: BenchRequest, wav_ref: torch.Tensor, runs: int
) -> dict[str, float]:
    """macOS: time the saved packages through Core ML and compare their waveform (ALL units)."""
    ct = load_coremltools()

    def model(stage: str) -> Any:
        return ct.models.MLModel(
            str(folder / f"{stage}.mlpackage"), compute_units=ct.ComputeUnit.ALL
        )

    flow = CoreMLFlow(subject.flow.config, model("flow_encoder"), model("flow_cfm"))
    hift = CoreMLHiFT(subject.hift.config, model("hift_source"), model("hift_decode"))
    times, wav = [], wav_ref
    for _ in range(runs + 1):
        started = time.perf_counter()
        mel, _ = flow.inference(
            request.token, request.prompt_token, request.prompt_feat, request.embedding
        )
        wav = hift.inference(mel, noise=request.source_noise).wav
        times.append(time.perf_counter() - started)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)  # bytes on macOS
    return {"first_s": times[0], "mean_s": sum(times[1:]) / runs, "peak_rss_mb": peak,
            "snr_db": snr_db(wav_ref, wav)}  # fmt: skip


def format_table(rows: list[VariantRow]) -> str:
    """A plain-text table; "x fp16" compares weight files (package = weights + program text)."""
    fp16 = next((r.weights_bytes for r in rows if r.variant == "fp16"), 0)
    header = ["variant", "package MB", "weights MB", "x fp16", "SNR dB", "HiFT SNR dB",
              "flow mel L1", "wav mel L1", "covered", "prepare s"]  # fmt: skip
    mac = any(r.core_ml for r in rows)
    if mac:
        header += ["first s", "mean s", "peak RSS MB", "Core ML SNR dB"]
    lines = [header]
    for r in rows:
        q = r.quality
        cells = [
            r.variant,
            f"{r.package_bytes / 1e6:.2f}",
            f"{r.weights_bytes / 1e6:.2f}",
            f"{r.weights_bytes / fp16:.2f}" if fp16 else "-",
            _db(q.snr_db),
            _db(q.hift_snr_db),
            f"{q.flow_mel_l1:.4f}",
            f"{q.wav_mel_l1:.4f}",
            f"{100 * q.coverage:.1f}%",
            f"{r.prepare_s:.1f}",
        ]
        if mac:
            c = r.core_ml or {}
            digits = {"first_s": 3, "mean_s": 3, "peak_rss_mb": 0, "snr_db": 1}
            cells += [f"{c.get(k, float('nan')):.{d}f}" for k, d in digits.items()]
        lines.append(cells if q.finite else [*cells[:4], "NaN/inf", *cells[5:]])
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.rjust(w) if i else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    )


def _db(value: float) -> str:
    return "inf" if value == float("inf") else f"{value:.1f}"
