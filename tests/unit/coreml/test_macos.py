"""Core ML prediction, the compiled-model cache, compute units and doctor's Core ML rows:
macOS only.

Linux has no Core ML runtime (coremltools: "Model prediction is only supported on macOS"), so
every test here is skipped elsewhere with that reason shown (`pytest -ra`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shared.settings import Settings
from tests.unit.coreml.conftest import convert_once
from tests.unit.coreml.micro import FLOW_STEPS, MICRO_FLOW, Converted, flow_row
from workers.coreml.convert.build import (
    convert_model_dir,
    load_flow_and_hift,
    load_stages,
)
from workers.coreml.convert.compat import load_coremltools
from workers.coreml.convert.graphs import pack_cfm_frames
from workers.coreml.convert.options import ConvertOptions
from workers.coreml.convert.stages_convert import convert_cfm
from workers.coreml.loader import load_coreml_stages
from workers.model.flow.batch import FlowRow
from workers.model.llm.qwen2 import KVCache
from workers.model.loader import load_model
from workers.tools.bench.coreml_quality import bench_request, snr_db, synthesize
from workers.tools.doctor.host_checks import macos_version
from workers.tools.doctor.measure import RunOptions
from workers.tools.doctor.model_checks import cache_row, packages_row
from workers.tools.doctor.rows import Status
from workers.tools.doctor.run_checks import run_rows
from workers.tools.doctor.stack_checks import coreml_runtime_row, mps_row
from workers.tools.fixtures.random_weights import random_flow

pytestmark = [
    pytest.mark.macos,
    pytest.mark.skipif(
        sys.platform != "darwin",
        reason="needs macOS: Core ML prediction, compiled models and compute units do not "
        "exist on Linux (conversion is tested by the other modules)",
    ),
]
DOCTOR_MIN_SNR_DB = 10.0  # doctor's flow mel on the micro model: a loose floor, fp16 vs fp32
FP16_MIN_SNR_DB = 20.0  # fp16 arithmetic on random weights; the Linux bench shows the spread


@pytest.fixture(scope="module")
def converted(micro_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Converted:
    """Here the micro model converted with the model's own Euler steps: the loads, warm-ups
    and doctor's rows below are a worker's, whose engine asks for the model's steps (the
    session's `converted` has fewer and would be refused)."""
    return convert_once(micro_model_dir, tmp_path_factory, "micro-coreml-model-steps")


def load(converted: Converted, cache: Path, units: str | None = None) -> Any:
    return load_coreml_stages(
        converted.model_dir, coreml_dir=converted.out_dir, cache_dir=cache, compute_units=units
    )


@torch.inference_mode()
def test_packages_predict_what_pytorch_computes(converted: Converted, tmp_path: Path) -> None:
    stages = load(converted, tmp_path / "cache")
    flow, hift = load_flow_and_hift(converted.model_dir)
    request = bench_request(flow, hift, tokens=30, prompt_tokens=12, seed=0)
    mel_ref, wav_ref = synthesize(flow, hift, request)
    mel, _ = stages.flow.inference(
        request.token, request.prompt_token, request.prompt_feat, request.embedding
    )
    wav = stages.hift.inference(mel, noise=request.source_noise).wav
    assert torch.isfinite(mel).all() and torch.isfinite(wav).all()
    assert float((mel - mel_ref).abs().mean()) < 0.05
    assert snr_db(wav_ref, wav) > FP16_MIN_SNR_DB


@torch.inference_mode()
def test_batched_calls_give_each_row_what_it_gets_alone(
    converted: Converted, tmp_path: Path
) -> None:
    """Real Core ML at B = 4 (3 rows + a filler) against B = 1 on each row, fp16 packages."""
    stages = load(converted, tmp_path / "cache")
    assert stages.flow.batch_sizes.sizes == (1, 2, 4, 8)
    flow, hift = load_flow_and_hift(converted.model_dir)
    requests = [bench_request(flow, hift, tokens=t, prompt_tokens=p, seed=s)
                for s, (t, p) in enumerate([(30, 12), (18, 6), (30, 12)])]  # fmt: skip
    rows = [FlowRow(r.token, r.prompt_token, r.prompt_feat, r.embedding) for r in requests]
    mels = stages.flow.batched_inference(rows)
    for row, mel in zip(rows, mels, strict=True):
        alone, _ = stages.flow.inference(
            row.token, row.prompt_token, row.prompt_feat, row.embedding
        )
        assert torch.isfinite(mel).all()
        assert float((mel - alone[0]).abs().mean()) < 0.02
    noises = [r.source_noise for r in requests]
    wavs = stages.hift.batched_inference([m[None] for m in mels], noises)  # rows 0 and 2 share
    for mel, noise, wav in zip(mels, noises, wavs, strict=True):
        assert snr_db(stages.hift.inference(mel[None], noise=noise).wav, wav) > FP16_MIN_SNR_DB


def test_the_compiled_model_is_reused_by_later_loads(
    converted: Converted, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    load(converted, cache)
    compiled = sorted(p.name for p in (cache / "compiled").iterdir())
    assert len(compiled) == 4
    ct = load_coremltools()

    def no_compiling(*_args: object) -> None:
        raise AssertionError("compiled again although the cache holds this package")

    monkeypatch.setattr(ct.models.utils, "compile_model", no_compiling)
    load(converted, cache).warm_up()
    assert sorted(p.name for p in (cache / "compiled").iterdir()) == compiled


@pytest.mark.parametrize("units", ["ALL", "CPU_AND_NE", "CPU_AND_GPU", "CPU_ONLY"])
def test_every_compute_unit_setting_loads_and_runs(
    converted: Converted, tmp_path: Path, units: str
) -> None:
    stages = load(converted, tmp_path / "cache", units)
    assert stages.compute_units == units
    stages.warm_up()


def test_enumerated_buckets_predict_like_the_flexible_graph() -> None:
    flow = random_flow(MICRO_FLOW)
    model = convert_cfm(flow, ConvertOptions(flow_buckets=(16, 32))).model
    g = torch.Generator().manual_seed(0)
    mu, cond, noise = (torch.randn(1, 80, 20, generator=g) for _ in range(3))
    spks = torch.randn(1, 80, generator=g)
    with torch.no_grad():
        expected = flow.decoder(noise, mu, torch.ones(1, 1, 20), spks, cond)
    frames = pack_cfm_frames(noise, mu, cond, torch.ones(1, 1, 20))
    padded = torch.nn.functional.pad(frames, (0, 12)).numpy()
    mel = model.predict({"frames": padded, "spks": spks.numpy()})["mel"][:, :, :20]
    assert np.abs(mel - expected.numpy()).mean() < 0.05


@pytest.fixture(scope="module")
def converted_macos15(micro_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The micro model converted for macOS 15: flow, HiFT and the stateful LLM."""
    out_dir = tmp_path_factory.mktemp("micro-coreml-macos15")
    convert_model_dir(micro_model_dir, out_dir, ConvertOptions(target="macOS15", llm_capacity=64))
    return out_dir


@torch.inference_mode()
def test_the_stateful_llm_decodes_what_pytorch_decodes(
    micro_model_dir: Path, converted_macos15: Path, tmp_path: Path
) -> None:
    stages = load_coreml_stages(
        micro_model_dir, coreml_dir=converted_macos15, cache_dir=tmp_path / "cache"
    )
    assert stages.llm is not None
    stages.warm_up()
    reference = load_model(micro_model_dir).llm
    hidden = reference.config.backbone.hidden_size
    g = torch.Generator().manual_seed(0)
    steps = [torch.randn(1, 6, hidden, generator=g)] + [
        torch.randn(1, 1, hidden, generator=g) for _ in range(3)
    ]
    ours, theirs = KVCache(reference.config.backbone, 16), KVCache(reference.config.backbone, 16)
    for step in steps:
        expected = reference.step_logp(step, theirs)
        got = stages.llm.step_logp(step, ours)
        assert torch.isfinite(got).all()
        assert float((got.exp() - expected.exp()).abs().max()) < 0.02  # fp16 probabilities


def doctor_settings(converted: Converted, tmp_path: Path) -> Settings:
    return Settings(
        model_dir=converted.model_dir,
        coreml_dir=converted.out_dir,
        coreml_cache_dir=tmp_path / "doctor-cache",
        hash_cache_dir=tmp_path / "doctor-hashes",
        threads=1,
    )


def test_doctor_finds_the_native_runtime_and_mps() -> None:
    runtime = coreml_runtime_row(system="darwin")
    assert runtime.status is Status.OK, runtime.detail
    assert mps_row(system="darwin").status in (Status.OK, Status.FAIL)  # a real verdict, no skip


def test_doctor_reports_the_compile_cache_misses_then_hits(
    converted: Converted, tmp_path: Path
) -> None:
    settings = doctor_settings(converted, tmp_path)
    before = cache_row(settings, converted.out_dir, system="darwin")
    assert before.figures is not None and before.figures["misses"] == len(
        converted.manifest.packages
    )
    load(converted, settings.coreml_cache_dir)
    after = cache_row(settings, converted.out_dir, system="darwin")
    assert after.status is Status.OK and after.figures is not None
    assert after.figures["misses"] == 0 and after.figures["size_bytes"] > 0
    assert packages_row(settings, converted.model_dir, converted.out_dir).status is Status.OK


def test_doctor_runs_every_compute_unit_against_torch_cpu(
    converted: Converted, tmp_path: Path
) -> None:
    settings = doctor_settings(converted, tmp_path)
    rows = run_rows(
        settings,
        converted.model_dir,
        quick=False,
        model_loaded=True,
        options=RunOptions(runs=1, tokens=10),
        system="darwin",
    )
    by_name = {row.name: row for row in rows}
    assert by_name["Core ML cold compile and warm load"].status is Status.OK
    for units in ("ALL", "CPU_AND_GPU", "CPU_AND_NE"):
        row = by_name[f"Core ML {units}"]
        assert row.status is Status.OK, row.detail
        assert row.figures is not None
        stages = {s["stage"]: s for s in row.figures["stages"]}
        # fp16 packages against fp32 torch on identical inputs: close, never identical
        assert stages["flow"]["snr_db"] is not None and stages["flow"]["snr_db"] > DOCTOR_MIN_SNR_DB
        assert stages["flow"]["max_abs_error"] > 0
        assert stages["HiFT"]["max_abs_error"] is not None
    plan = by_name["Core ML compute plan (ops on ANE / GPU / CPU)"]
    if macos_version() >= (14, 4):
        assert plan.status is Status.OK, plan.detail
        assert plan.figures is not None and all(
            sum(c.values()) > 0 for c in plan.figures["ops"].values()
        )
    else:
        assert plan.status is Status.SKIP


@torch.inference_mode()
def test_cosyvoice3_packages_predict_what_pytorch_computes(
    converted3: Converted, tmp_path: Path
) -> None:
    """The session's CosyVoice 3 conversion (2 Euler steps) on real Core ML: the loader takes
    it for the engine asking for 2 steps, warms it up, and flow and causal HiFT predict what
    our PyTorch CosyVoice 3 computes."""
    stages = load_coreml_stages(
        converted3.model_dir,
        coreml_dir=converted3.out_dir,
        cache_dir=tmp_path / "cache",
        flow_steps=FLOW_STEPS,
    )
    stages.warm_up()
    flow, hift = load_stages(converted3.model_dir, FLOW_STEPS)
    row = flow_row(tokens=30, prompt=12, seed=0)
    mel_ref, _ = flow.inference(row.token, row.prompt_token, row.prompt_feat, row.embedding)
    mel, _ = stages.flow.inference(row.token, row.prompt_token, row.prompt_feat, row.embedding)
    assert torch.isfinite(mel).all() and float((mel - mel_ref).abs().mean()) < 0.05
    wav = stages.hift.inference(mel_ref).wav
    assert torch.isfinite(wav).all()
    assert snr_db(hift.inference(mel_ref).wav, wav) > FP16_MIN_SNR_DB
