"""The converted programs themselves, run on Linux by the MIL interpreter in tests/doubles.

The other tests check specs, the runtime's logic and the traced graphs; these run what
coremltools actually wrote (fp16 values rounded after every op, as fp16 storage does) through
the runtime and compare with PyTorch. They caught two silent converter problems: `x % 1`
turned into `x - x`, and token ids and position angles computed in fp16.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from shared.errors import ModelLoadError
from tests.doubles.mil_interpreter import PackagePrograms
from tests.unit.coreml.micro import FLOW_STEPS, Converted
from workers.coreml.convert.build import load_flow_and_hift
from workers.coreml.convert.compat import load_coremltools
from workers.coreml.engine import CoreMLPlacement, load_coreml_engine
from workers.coreml.loader import runtime_stages
from workers.coreml.runtime import CoreMLFlow, CoreMLHiFT
from workers.coreml.stages import ALL_STAGES
from workers.engine.pipeline import EngineOptions
from workers.model.directory import ModelDirectory
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.model.hift.model import HiFTGenerator
from workers.tools.bench.coreml_quality import bench_request, snr_db, synthesize

Modules = tuple[CausalMaskedDiffWithXvec, HiFTGenerator]
FP16_MEL_L1 = 0.02  # mean |Δ log-mel|, fp16 flow vs float32: 7e-4 measured, 0.23 with ids and
# position angles in fp16 (coremltools' plain FLOAT16)
FP16_HIFT_SNR_DB = 35.0  # fp16 vocoder against float32 on the same mel (measured ~55 dB)


@pytest.fixture(scope="module")
def modules(micro_model_dir: Path) -> Modules:
    return load_flow_and_hift(micro_model_dir, FLOW_STEPS)  # as many steps as the conversion


def runtime(converted: Converted, programs: PackagePrograms) -> tuple[CoreMLFlow, CoreMLHiFT]:
    """The runtime stages over the interpreted packages, shaped by the manifest (batched)."""
    models = {stage: programs.predictor(stage) for stage in ALL_STAGES}
    directory = ModelDirectory(converted.model_dir)
    return runtime_stages(converted.manifest, directory, models, flow_steps=FLOW_STEPS)


@torch.inference_mode()
def test_the_converted_flow_computes_what_pytorch_computes(
    converted: Converted, converted_programs: PackagePrograms, modules: Modules
) -> None:
    flow, hift = modules
    # 150 tokens = 300 mel frames: long enough that fp16 position angles would show
    request = bench_request(flow, hift, tokens=110, prompt_tokens=40, seed=1)
    mel_ref, _ = synthesize(flow, hift, request)
    stage, _ = runtime(converted, converted_programs)
    mel, _ = stage.inference(
        request.token, request.prompt_token, request.prompt_feat, request.embedding
    )
    assert mel.shape == mel_ref.shape
    assert float((mel - mel_ref).abs().mean()) < FP16_MEL_L1


@torch.inference_mode()
def test_the_converted_vocoder_computes_what_pytorch_computes(
    converted: Converted, converted_programs: PackagePrograms, modules: Modules
) -> None:
    flow, hift = modules
    request = bench_request(flow, hift, tokens=30, prompt_tokens=10, seed=2)
    mel_ref, wav_ref = synthesize(flow, hift, request)
    _, stage = runtime(converted, converted_programs)
    out = stage.inference(mel_ref, noise=request.source_noise)
    expected = hift.inference(mel_ref, noise=request.source_noise)
    torch.testing.assert_close(out.f0, expected.f0, rtol=1e-4, atol=1e-3)  # float32 package
    assert snr_db(wav_ref, out.wav) > FP16_HIFT_SNR_DB


def test_integer_derived_values_stay_float32_in_fp16_packages(converted: Converted) -> None:
    ct = load_coremltools()
    path = converted.out_dir / "flow_encoder.mlpackage"
    spec = ct.models.MLModel(str(path), skip_model_load=True).get_spec()
    (block,) = spec.mlProgram.functions["main"].block_specializations.values()
    dtypes: dict[str, set[int]] = {}
    for node in block.operations:
        dtypes.setdefault(node.type, set()).add(node.outputs[0].type.tensorType.dataType)
    fp32, fp16 = ct.proto.MIL_pb2.FLOAT32, ct.proto.MIL_pb2.FLOAT16
    assert dtypes["clip"] == {fp32}  # token ids
    assert dtypes["sin"] == dtypes["cos"] == {fp32}  # relative-position angles
    assert dtypes["linear"] == {fp16}  # the rest computes in fp16


def test_a_conversion_made_with_other_flow_steps_is_refused(converted: Converted) -> None:
    """The manifest records the Euler steps unrolled into flow_cfm; the runtime takes the
    conversion only for an engine asking for as many (None: the model's own 10)."""
    assert converted.manifest.flow_steps == FLOW_STEPS
    directory = ModelDirectory(converted.model_dir)
    models: dict[str, Any] = {stage: object() for stage in ALL_STAGES}  # never called
    asks_for_10 = (
        r"flow_cfm solves in 2 Euler steps, the engine asks for 10; "
        r"run `cosyq-worker convert --flow-steps 10` again"
    )
    with pytest.raises(ModelLoadError, match=asks_for_10):
        runtime_stages(converted.manifest, directory, models)
    with pytest.raises(ModelLoadError, match="solves in 2 Euler steps, the engine asks for 3"):
        runtime_stages(converted.manifest, directory, models, flow_steps=3)
    flow, _ = runtime_stages(converted.manifest, directory, models, flow_steps=FLOW_STEPS)
    assert flow.config.cfm.n_timesteps == FLOW_STEPS
    before = dataclasses.replace(converted.manifest, flow_steps=None)  # steps not recorded:
    flow, _ = runtime_stages(before, directory, models)  # such conversions unrolled the model's 10
    assert flow.config.cfm.n_timesteps == 10
    with pytest.raises(ModelLoadError, match="solves in 10 Euler steps, the engine asks for 2"):
        runtime_stages(before, directory, models, flow_steps=2)


def test_the_core_ml_engine_asks_for_its_options_flow_steps(
    converted: Converted, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[Any] = []

    def record(*_args: object, **kwargs: Any) -> None:
        asked.append(kwargs.get("flow_steps", "not passed"))
        raise ModelLoadError("recorded")

    monkeypatch.setattr("workers.coreml.engine.load_coreml_stages", record)
    placement = CoreMLPlacement("cpu", "cpu", "CPU_ONLY", converted.out_dir)
    for options in (None, EngineOptions(), EngineOptions(flow_steps=FLOW_STEPS)):
        with pytest.raises(ModelLoadError, match="recorded"):
            load_coreml_engine(
                converted.model_dir, placement, cache_dir=tmp_path, compile_timeout_s=1,
                options=options,
            )  # fmt: skip
    assert asked == [None, None, FLOW_STEPS]
