"""Conversion on Linux: package specs, the manifest, the CLI, and traps we guard against."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.doubles.mil_interpreter import MILPredictor
from tests.unit.coreml.micro import FLOW_STEPS, MICRO_FLOW, Converted
from workers.cli import main as worker_cli
from workers.coreml.convert.compat import load_coremltools
from workers.coreml.convert.graphs import pack_cfm_frames
from workers.coreml.convert.options import ConvertOptions
from workers.coreml.convert.stages_convert import convert_cfm, trace
from workers.coreml.manifest import MANIFEST_FILE, DimRange, package_sha256, read_manifest
from workers.coreml.stages import ALL_STAGES, FLOW_CFM, HIFT_SOURCE, stage_specs
from workers.model.directory import file_sha256
from workers.tools.fixtures.random_weights import random_flow


def package_spec(path: Path) -> Any:
    ct = load_coremltools()
    return ct.models.MLModel(str(path), skip_model_load=True).get_spec()


def describe(feature: Any) -> tuple[str, tuple[Any, ...]]:
    """(dtype name, shape) of a spec feature; flexible axes as (lower, upper) pairs."""
    array = feature.type.multiArrayType
    dtype = type(array).ArrayDataType.Name(array.dataType)
    ranges = array.shapeRange.sizeRanges
    if ranges:
        shape = tuple(
            r.lowerBound if r.lowerBound == r.upperBound else (r.lowerBound, r.upperBound)
            for r in ranges
        )
    else:
        shape = tuple(array.shape)
    return dtype, shape


def test_packages_have_the_documented_inputs_outputs_and_lengths(converted: Converted) -> None:
    specs = stage_specs(80, 192, harmonics=9, batched=True)
    b, n, t, samples = (1, 8), (1, 7500), (2, 15000), (960, 480 * 15000)  # B: --batch-sizes 1..8
    expected_inputs = {
        "flow_encoder": {"tokens": ("INT32", (b, n)), "lengths": ("INT32", (b,)),
                         "embedding": ("FLOAT32", (b, 192))},
        "flow_cfm": {"frames": ("FLOAT32", (b, 241, t)), "spks": ("FLOAT32", (b, 80))},
        "hift_source": {"mel": ("FLOAT32", (b, 80, t)), "noise": ("FLOAT32", (b, 9, samples))},
        "hift_decode": {"mel": ("FLOAT32", (b, 80, t)), "source": ("FLOAT32", (b, 1, samples))},
    }  # fmt: skip
    for stage in ALL_STAGES:
        spec = package_spec(converted.out_dir / specs[stage].package)
        inputs = {f.name: describe(f) for f in spec.description.input}
        assert inputs == expected_inputs[stage], stage
        outputs = {f.name: describe(f)[0] for f in spec.description.output}
        assert outputs == {o.name: "FLOAT32" for o in specs[stage].outputs}, stage
        assert spec.WhichOneof("Type") == "mlProgram"


def test_manifest_is_complete_and_matches_the_files(converted: Converted) -> None:
    manifest = read_manifest(converted.out_dir)
    assert manifest == converted.manifest
    assert set(manifest.packages) == set(ALL_STAGES)
    assert manifest.source_checkpoints == {
        name: file_sha256(converted.model_dir / name) for name in ("flow.pt", "hift.pt")
    }
    assert set(manifest.tools) == {"coremltools", "torch", "numpy", "python"}
    assert (manifest.precision, manifest.weights, manifest.target) == ("fp16", "none", "macOS14")
    assert manifest.compute_units == "ALL" and manifest.created_utc
    assert manifest.flow_steps == FLOW_STEPS  # --flow-steps, unrolled into flow_cfm
    specs = stage_specs(80, 192, harmonics=9, batched=True)
    for stage, entry in manifest.packages.items():
        path = converted.out_dir / entry.path
        assert entry.sha256 == package_sha256(path)
        assert 0 < entry.weights_bytes < entry.size_bytes
        assert (entry.inputs, entry.outputs) == (specs[stage].inputs, specs[stage].outputs)
        assert entry.precision == ("fp32" if stage == HIFT_SOURCE else "fp16")
        assert entry.compression == "none" and entry.buckets == ()
        assert set(entry.dims) == {s for t in entry.inputs for s in t.symbols}
        assert entry.batch_sizes == (1, 2, 4, 8)  # the default --batch-sizes
    raw = json.loads((converted.out_dir / MANIFEST_FILE).read_text())
    assert raw["packages"]["flow_encoder"]["dims"] == {
        "B": {"lower": 1, "upper": 8},
        "N": {"lower": 1, "upper": 7500},
    }
    assert raw["packages"]["flow_cfm"]["batch_sizes"] == [1, 2, 4, 8]
    assert raw["flow_steps"] == FLOW_STEPS


def test_convert_command_lists_packages_and_says_running_needs_macos(
    converted: Converted,
) -> None:
    assert "flow_cfm.mlpackage" in converted.cli_output
    assert "T 2..15000" in converted.cli_output
    assert "B in {1,2,4,8}" in converted.cli_output
    assert f"flow steps {FLOW_STEPS}" in converted.cli_output
    assert "Running these packages needs macOS" in converted.cli_output
    assert "LLM: not converted (stateful KV-cache models need --target macOS15)" in (
        converted.cli_output
    )


def test_convert_command_rejects_bad_options_and_missing_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "out")
    assert worker_cli(["convert", str(tmp_path), out, "--weights", "int8-block"]) == 2
    assert "needs --target macOS15" in capsys.readouterr().err
    assert worker_cli(["convert", str(tmp_path), out, "--batch-sizes", "2,4"]) == 2
    assert "--batch-sizes: batch sizes 2,4" in capsys.readouterr().err
    assert worker_cli(["convert", str(tmp_path), out, "--flow-steps", "0"]) == 2
    assert "--flow-steps 0: at least 1" in capsys.readouterr().err
    assert worker_cli(["convert", str(tmp_path / "nowhere"), out]) == 1
    assert "model directory not found" in capsys.readouterr().err


def test_the_sine_source_keeps_its_modulo(converted: Converted) -> None:
    """coremltools would turn `x % 1` into `x - x`; our converter override keeps the floor."""
    spec = package_spec(converted.out_dir / "hift_source.mlpackage")
    (block,) = spec.mlProgram.functions["main"].block_specializations.values()
    ops = list(block.operations)
    assert any(op.type == "floor" for op in ops)
    for op in ops:
        if op.type == "sub":
            x, y = (op.inputs[k].arguments[0].name for k in ("x", "y"))
            assert x != y, f"{op.outputs[0].name} = {x} - {x}: the modulo was dropped"


def test_cfm_buckets_become_enumerated_shapes_and_padding_keeps_the_frames(
    tmp_path: Path,
) -> None:
    flow = random_flow(MICRO_FLOW)
    stage = convert_cfm(flow, ConvertOptions(flow_buckets=(16, 32, 64), batch_sizes=(1, 2)))
    inputs = {f.name: f for f in stage.model.get_spec().description.input}
    enumerated = inputs["frames"].type.multiArrayType.enumeratedShapes.shapes
    shapes = [tuple(s.shape) for s in enumerated]  # every batch size times every bucket
    assert shapes == [(rows, 241, t) for rows in (1, 2) for t in (16, 32, 64)]
    assert describe(inputs["spks"]) == ("FLOAT32", ((1, 2), 80))  # one enumerated input only
    assert stage.spec.name == FLOW_CFM and stage.buckets == (16, 32, 64)
    assert stage.dims == {"B": DimRange(1, 2)} and stage.batch_sizes == (1, 2)
    stage.model.save(str(tmp_path / "cfm.mlpackage"))
    g = torch.Generator().manual_seed(0)
    noise, mu, cond = (torch.randn(1, 80, 20, generator=g) for _ in range(3))
    spks, mask = torch.randn(1, 80, generator=g), torch.ones(1, 1, 20)
    with torch.no_grad():
        expected = flow.decoder(noise, mu, mask, spks, cond)
    padded = F.pad(pack_cfm_frames(noise, mu, cond, mask), (0, 12))  # to the 32 bucket, mask 0
    program = MILPredictor(tmp_path / "cfm.mlpackage")
    mel = program.predict({"frames": padded.numpy(), "spks": spks.numpy()})["mel"]
    assert mel.shape == (1, 80, 32)
    assert float(np.abs(mel[:, :, :20] - expected.numpy()).mean()) < 0.01


class BakedLength(nn.Module):
    """Loops over the time axis in Python: the trace unrolls the example's length."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = torch.zeros_like(x[..., 0])
        for i in range(x.size(-1)):
            total = total + x[..., i]
        return total


def test_a_trace_that_bakes_in_a_length_is_refused() -> None:
    with pytest.raises(ValueError, match="does not generalise to other lengths"):
        trace(BakedLength(), (torch.ones(1, 2, 4),), (torch.ones(1, 2, 6),))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"weights": "int8-block"}, "needs --target macOS15"),
        ({"weights": "int4"}, "--weights 'int4': choose one of"),
        ({"precision": "bf16"}, "--precision 'bf16'"),
        ({"flow_buckets": (512, 256)}, "strictly increasing"),
        ({"flow_buckets": (1,)}, "strictly increasing frame counts >= 2"),
        ({"batch_sizes": (2, 4)}, "--batch-sizes: batch sizes 2,4: strictly increasing"),
        ({"batch_sizes": (1, 4, 4)}, "--batch-sizes"),
        ({"batch_sizes": (1, 32)}, "from 1 up to 16"),
        ({"flow_steps": 0}, "--flow-steps 0: at least 1"),
    ],
)
def test_options_are_checked_up_front(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ConvertOptions(**options)
