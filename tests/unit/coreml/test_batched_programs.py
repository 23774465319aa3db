"""Batched conversions run by the MIL interpreter: each row as the batch-1 call gives it alone.

One small fp32 conversion (the micro flow with one Euler step, the micro HiFT) with batch sizes
1, 2, 4: its programs run at B = 4 on padded rows (rows of different lengths, a filler row to
reach the size) and each row's output is compared with the same packages called at B = 1 on
that row alone, at the fp32 tolerance of the other runtime tests; the manifest round-trips and
names the sizes; and `--batch-sizes 1` still converts the unbatched programs of before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from shared.errors import ModelLoadError
from tests.doubles.coreml_predictors import RecordingPredictor
from tests.doubles.mil_interpreter import PackagePrograms
from tests.unit.coreml.micro import MICRO_FLOW, flow_row
from workers.coreml.convert.build import (
    convert_modules,
    load_flow_and_hift,
    save_package,
    write_manifest,
)
from workers.coreml.convert.options import ConvertOptions
from workers.coreml.convert.stages_convert import convert_cfm
from workers.coreml.loader import runtime_stages
from workers.coreml.manifest import Manifest, read_manifest
from workers.coreml.runtime import CoreMLFlow, CoreMLHiFT
from workers.coreml.stages import ALL_STAGES, FLOW_CFM, HIFT_DECODE
from workers.model.directory import ModelDirectory
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.model.hift.model import HiFTGenerator
from workers.model.hift.source import draw_source_noise
from workers.tools.fixtures.random_weights import random_flow

pytestmark = pytest.mark.timeout(900)
SIZES = (1, 2, 4)
FP32 = {"atol": 1e-5, "rtol": 1e-5}  # the fp32 bound of the runtime tests (test_runtime_logic)


@dataclass(frozen=True)
class Batched:
    flow: CausalMaskedDiffWithXvec
    hift: HiFTGenerator
    out_dir: Path
    manifest: Manifest
    programs: PackagePrograms  # loaded once for the module's tests

    def stages(self) -> tuple[CoreMLFlow, CoreMLHiFT]:
        models = {s: RecordingPredictor(self.programs.predictor(s)) for s in ALL_STAGES}
        packages = self.manifest.packages
        flow = CoreMLFlow(
            self.flow.config,
            models["flow_encoder"],
            models["flow_cfm"],
            batch_sizes=packages[FLOW_CFM].batch_sizes,
        )
        hift = CoreMLHiFT(
            self.hift.config,
            models["hift_source"],
            models["hift_decode"],
            batch_sizes=packages[HIFT_DECODE].batch_sizes,
        )
        return flow, hift


@pytest.fixture(scope="module")
def batched(micro_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Batched:
    out_dir = tmp_path_factory.mktemp("batched-coreml")
    flow, (_, hift) = random_flow(MICRO_FLOW), load_flow_and_hift(micro_model_dir)
    options = ConvertOptions(precision="fp32", batch_sizes=SIZES)
    converted = convert_modules(flow, hift, options)
    entries = {name: save_package(stage, out_dir) for name, stage in converted.items()}
    manifest = write_manifest(
        entries,
        out_dir,
        options=options,
        sources={},
        model_name="micro",
        flow_steps=MICRO_FLOW.cfm.n_timesteps,
    )
    return Batched(flow, hift, out_dir, manifest, PackagePrograms(out_dir))


def rows_per_call(predictor: Any) -> list[int]:
    assert isinstance(predictor, RecordingPredictor)
    return [next(iter(shapes.values()))[0] for shapes in predictor.calls]


def test_the_manifest_round_trips_with_the_batch_sizes(batched: Batched) -> None:
    assert read_manifest(batched.out_dir) == batched.manifest
    for stage in ALL_STAGES:
        entry = batched.manifest.packages[stage]
        assert entry.batch_sizes == SIZES and entry.dims["B"].upper == 4
        assert all(t.shape[0] == "B" for t in entry.inputs), stage
    encoder = batched.manifest.packages["flow_encoder"]
    assert [t.name for t in encoder.inputs] == ["tokens", "lengths", "embedding"]


@torch.inference_mode()
def test_the_batched_flow_program_gives_each_padded_row_its_batch_1_output(
    batched: Batched,
) -> None:
    flow, _ = batched.stages()
    rows = [flow_row(24, 10, 1), flow_row(9, 4, 2), flow_row(17, 15, 3)]  # B = 4 with a filler
    mels = flow.batched_inference(rows)
    assert rows_per_call(flow.encoder) == rows_per_call(flow.cfm) == [4]
    for row, mel in zip(rows, mels, strict=True):
        inputs = (row.token, row.prompt_token, row.prompt_feat, row.embedding)
        alone, _ = flow.inference(*inputs)  # the same packages at B = 1
        assert mel.shape == alone[0].shape
        torch.testing.assert_close(mel, alone[0], **FP32)
        reference, _ = batched.flow.inference(*inputs)
        torch.testing.assert_close(alone, reference, atol=1e-4, rtol=1e-4)  # Core ML vs torch
    assert rows_per_call(flow.cfm) == [4, 1, 1, 1]


@torch.inference_mode()
def test_the_batched_vocoder_program_gives_each_row_its_batch_1_output(batched: Batched) -> None:
    _, hift = batched.stages()
    lengths = [12, 12, 9, 12]  # three rows of 12 frames: B = 4 with a filler; 9 alone
    g = torch.Generator().manual_seed(4)
    mels = [torch.randn(1, 80, t, generator=g) for t in lengths]
    noises = [draw_source_noise(1, 9, 480 * t, generator=g) for t in lengths]
    wavs = hift.batched_inference(mels, noises)
    assert rows_per_call(hift.source) == rows_per_call(hift.decode_model) == [4, 1]
    for mel, noise, wav in zip(mels, noises, wavs, strict=True):
        alone = hift.inference(mel, noise=noise).wav
        assert wav.shape == alone.shape == (1, 480 * mel.size(-1))
        torch.testing.assert_close(wav, alone, **FP32)


def test_batch_size_1_converts_the_unbatched_programs() -> None:
    stage = convert_cfm(random_flow(MICRO_FLOW), ConvertOptions(batch_sizes=(1,)))
    inputs: dict[str, Any] = {f.name: f for f in stage.model.get_spec().description.input}
    ranges = inputs["frames"].type.multiArrayType.shapeRange.sizeRanges
    assert [(r.lowerBound, r.upperBound) for r in ranges] == [(1, 1), (241, 241), (2, 15000)]
    assert stage.batch_sizes == (1,) and "B" not in stage.dims


def test_a_stage_whose_packages_disagree_on_batch_sizes_is_refused(
    batched: Batched, micro_model_dir: Path
) -> None:
    packages = dict(batched.manifest.packages)
    packages[FLOW_CFM] = dataclasses.replace(packages[FLOW_CFM], batch_sizes=(1, 2))
    manifest = dataclasses.replace(batched.manifest, packages=packages)
    directory = ModelDirectory(micro_model_dir)
    models = {stage: object() for stage in ALL_STAGES}  # never called: refused before
    with pytest.raises(ModelLoadError, match="flow_encoder and flow_cfm have different batch"):
        runtime_stages(manifest, directory, models, flow_steps=MICRO_FLOW.cfm.n_timesteps)
