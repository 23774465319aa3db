"""CosyVoice 3's converted programs, run on Linux by the MIL interpreter in tests/doubles.

One session conversion of the CosyVoice 3 micro model (`converted3`: 2 Euler steps, default
options) through `cosyq-worker convert`; the packages coremltools wrote run through the runtime
(`runtime_stages`, as a Mac's loader builds it) and are compared with our PyTorch CosyVoice 3,
itself checked against the official arrays (`test_cosyvoice3_graphs`, `model check-reference`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shared.errors import ModelLoadError
from tests.doubles.coreml_predictors import TorchStatefulPredictor
from tests.doubles.mil_interpreter import MILPredictor
from tests.unit.coreml.micro import FLOW_STEPS, Converted, flow_row
from tests.unit.coreml.test_doctor_rows import settings_for
from workers.coreml.causal_runtime import CoreMLCausalHiFT
from workers.coreml.convert.build import load_stages
from workers.coreml.convert.llm_graph import StatefulLLMGraph
from workers.coreml.engine import CoreMLPlacement, coreml_engine
from workers.coreml.llm_runtime import CoreMLQwen2LM, embeddings_only
from workers.coreml.loader import CoreMLStages, runtime_stages
from workers.coreml.runtime import CoreMLFlow
from workers.coreml.stages import ALL_STAGES, LLM_DECODE, LLM_PREFILL, llm_specs
from workers.engine.api import SynthesisInput, VoicePrompt
from workers.engine.pipeline import EngineOptions, build_engine
from workers.model.causal_hift.model import CausalHiFTGenerator
from workers.model.checkpoint import read_state_dict
from workers.model.directory import ModelDirectory
from workers.model.dit.model import CausalMaskedDiffWithDiT
from workers.model.loader import load_model
from workers.tools.bench.coreml_quality import snr_db
from workers.tools.doctor.model_checks import packages_row
from workers.tools.doctor.rows import Status

FP16_MEL_L1 = 0.02  # mean |Δ log-mel|, fp16 DiT flow vs float32 (as CosyVoice 2's bound)
FP16_HIFT_SNR_DB = 35.0  # fp16 causal vocoder against float32 on the same mel
F0_FLOAT32_RTOL = 5e-4  # F0 in float32 (the package) vs float64 (PyTorch), relative to max


@pytest.fixture(scope="module")
def modules3(micro3_model_dir: Path) -> tuple[CausalMaskedDiffWithDiT, CausalHiFTGenerator]:
    flow, hift = load_stages(micro3_model_dir, FLOW_STEPS)
    assert isinstance(flow, CausalMaskedDiffWithDiT) and isinstance(hift, CausalHiFTGenerator)
    return flow, hift


@pytest.fixture(scope="module")
def runtime3(converted3: Converted) -> tuple[CoreMLFlow, CoreMLCausalHiFT]:
    """The runtime stages over the interpreted packages, shaped by the manifest."""
    models = {s: MILPredictor(converted3.out_dir / f"{s}.mlpackage") for s in ALL_STAGES}
    directory = ModelDirectory(converted3.model_dir)
    flow, hift = runtime_stages(converted3.manifest, directory, models, flow_steps=FLOW_STEPS)
    assert isinstance(hift, CoreMLCausalHiFT)
    return flow, hift


def test_the_conversion_records_the_family(converted3: Converted, converted: Converted) -> None:
    manifest = converted3.manifest
    assert (manifest.family, converted.manifest.family) == ("cosyvoice3", "cosyvoice2")
    assert manifest.flow_steps == FLOW_STEPS and sorted(manifest.packages) == sorted(ALL_STAGES)
    assert manifest.packages["hift_source"].precision == "fp32"
    assert "manifest.json: cosyvoice3, " in converted3.cli_output
    assert "LLM: not converted" in converted3.cli_output


@torch.inference_mode()
def test_the_converted_dit_flow_computes_what_pytorch_computes(
    modules3: tuple[CausalMaskedDiffWithDiT, CausalHiFTGenerator],
    runtime3: tuple[CoreMLFlow, CoreMLCausalHiFT],
) -> None:
    flow, _ = modules3
    row = flow_row(tokens=110, prompt=40, seed=1)  # 300 mel frames
    expected, _ = flow.inference(row.token, row.prompt_token, row.prompt_feat, row.embedding)
    mel, _ = runtime3[0].inference(row.token, row.prompt_token, row.prompt_feat, row.embedding)
    assert mel.shape == expected.shape == (1, 80, 220)
    assert float((mel - expected).abs().mean()) < FP16_MEL_L1


@torch.inference_mode()
def test_padded_rows_of_the_batched_programs_come_out_as_alone(
    runtime3: tuple[CoreMLFlow, CoreMLCausalHiFT],
) -> None:
    """The batched DiT encoder masks each row's padding: two rows of different lengths in one
    call give what each gives alone, to fp16 rounding."""
    flow = runtime3[0]
    rows = [flow_row(tokens=30, prompt=10, seed=2), flow_row(tokens=18, prompt=6, seed=3)]
    together = flow.batched_inference(rows)
    for row, mel in zip(rows, together, strict=True):
        alone, _ = flow.inference(row.token, row.prompt_token, row.prompt_feat, row.embedding)
        assert mel.shape == alone[0].shape
        # fp16 rounding, not padding: a row's products are summed in another order at another
        # batch shape on some CPUs (0 on Zen 3; one fp16 step, 2e-3 at |mel| in [2, 4), on Zen 4),
        # while a leak of padding moves whole frames by far more.
        difference = (mel - alone[0]).abs()
        assert float(difference.max()) < 8e-3 and float(difference.mean()) < 1e-4


@torch.inference_mode()
def test_the_converted_causal_vocoder_computes_what_pytorch_computes(
    modules3: tuple[CausalMaskedDiffWithDiT, CausalHiFTGenerator],
    runtime3: tuple[CoreMLFlow, CoreMLCausalHiFT],
) -> None:
    flow, hift = modules3
    row = flow_row(tokens=30, prompt=10, seed=4)
    mel, _ = flow.inference(row.token, row.prompt_token, row.prompt_feat, row.embedding)
    expected = hift.inference(mel)
    out = runtime3[1].inference(mel)
    scale = float(expected.f0.abs().max())
    torch.testing.assert_close(out.f0 / scale, expected.f0 / scale, atol=F0_FLOAT32_RTOL, rtol=0)
    assert out.wav.shape == expected.wav.shape == (1, 480 * mel.size(-1))
    assert snr_db(expected.wav, out.wav) > FP16_HIFT_SNR_DB
    with pytest.raises(ValueError, match="finalize=True path only"):
        runtime3[1].inference(mel, finalize=False)


def test_a_conversion_of_the_other_family_is_refused(
    converted: Converted, converted3: Converted
) -> None:
    models: dict[str, Any] = {stage: object() for stage in ALL_STAGES}  # never called
    for conversion, model_dir, made, asked in (
        (converted, converted3.model_dir, "cosyvoice2", "cosyvoice3"),
        (converted3, converted.model_dir, "cosyvoice3", "cosyvoice2"),
    ):
        with pytest.raises(ModelLoadError, match=f"of a {made} model, .* is {asked}; run"):
            runtime_stages(conversion.manifest, ModelDirectory(model_dir), models)


def test_doctor_names_the_conversions_family(
    converted: Converted, converted3: Converted, tmp_path: Path
) -> None:
    for conversion, name in ((converted3, "CosyVoice 3"), (converted, "CosyVoice 2")):
        settings = settings_for(conversion.model_dir, conversion.out_dir, tmp_path, "auto")
        row = packages_row(settings, conversion.model_dir, conversion.out_dir)
        assert row.status is Status.OK and f"{name} conversion" in row.detail, row.detail
    settings = settings_for(converted3.model_dir, converted.out_dir, tmp_path, "coreml")
    crossed = packages_row(settings, converted3.model_dir, converted.out_dir)
    assert crossed.status is Status.FAIL and crossed.fails
    assert "cosyvoice2 model, the model directory is cosyvoice3" in crossed.detail


def test_the_engine_on_cosyvoice3_core_ml_stages_synthesizes_like_the_torch_engine(
    converted3: Converted, runtime3: tuple[CoreMLFlow, CoreMLCausalHiFT]
) -> None:
    """The refusal is lifted: the real pipeline on a CosyVoice 3 directory with the converted
    flow and vocoder (interpreted here, warmed up as a Mac's loader does) and the Core ML LLM
    (its traced graph standing in); a streamed request gets its one piece whole (the Core ML
    graphs are the non-streaming path)."""
    flow, hift = runtime3
    llm = load_model(converted3.model_dir).llm
    specs = llm_specs(llm.config.backbone.hidden_size, llm.config.decoder_size)
    graph = StatefulLLMGraph(llm, 512)
    coreml_llm = CoreMLQwen2LM(
        llm.config,
        embeddings_only(llm.config, read_state_dict(converted3.model_dir / "llm.pt")),
        TorchStatefulPredictor(graph, specs[LLM_PREFILL]),
        TorchStatefulPredictor(graph, specs[LLM_DECODE]),
        capacity=512,
    )
    stages = CoreMLStages(flow, hift, converted3.manifest, "CPU_ONLY", coreml_llm)
    stages.warm_up()
    placement = CoreMLPlacement("cpu", "cpu", "CPU_ONLY", converted3.out_dir)
    options = EngineOptions(flow_steps=FLOW_STEPS)
    engine = coreml_engine(converted3.model_dir, placement, stages, options=options)
    assert (engine.identity.backend, engine.identity.family) == ("coreml", "cosyvoice3")
    reference = build_engine(converted3.model_dir, device="cpu", options=options)
    prompt = VoicePrompt(
        speech_tokens=np.arange(10, dtype=np.int32),
        mel=np.full((20, 80), -5.0, dtype=np.float32),
        embedding=np.ones(192, dtype=np.float32),
        transcript="a prompt",
    )
    request = SynthesisInput(text="Hello there, world.", prompt=prompt, seed=3)
    ours, theirs = engine.synthesize(request), reference.synthesize(request)
    assert ours.speech_tokens == theirs.speech_tokens > 0
    assert ours.samples.shape == theirs.samples.shape
    assert snr_db(torch.from_numpy(theirs.samples), torch.from_numpy(ours.samples)) > 20.0
    chunks: list[np.ndarray] = []
    streamed = engine.synthesize_streaming(request, chunks.append)
    assert [len(c) for c in chunks] == [len(ours.samples)]  # the piece whole, once
    np.testing.assert_array_equal(streamed.samples, ours.samples)
