"""Weight compression: size per scheme, and quality of the decompressed weights in PyTorch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.doubles.mil_interpreter import MILPredictor, PackagePrograms, load_package_program
from tests.unit.coreml.micro import FLOW_STEPS, MICRO_FLOW, Converted
from workers.coreml.convert.build import (
    WEIGHTS_FILE,
    load_flow_and_hift,
)
from workers.coreml.convert.compat import load_coremltools
from workers.coreml.convert.compress import (
    compress_model,
    decompressed_weights,
    load_into,
    program_weights,
)
from workers.coreml.convert.graphs import flow_graphs
from workers.coreml.convert.options import ConvertOptions
from workers.coreml.convert.stages_convert import convert_encoder
from workers.coreml.stages import ALL_STAGES, FLOW_ENCODER, HIFT_DECODE, stage_specs
from workers.model.directory import ModelDirectory
from workers.model.features import MelConfig
from workers.tools.bench.coreml_quality import (
    Quality,
    bench_request,
    measure,
    synthesize,
    variant_modules,
)
from workers.tools.fixtures.random_weights import random_flow

# The CFM compresses like the encoder but its unrolled 10-step program takes ~8 s per pass;
# `bench quantization` covers it. hift_source is never compressed (float32 by design).
COMPRESSED = (FLOW_ENCODER, HIFT_DECODE)
SCHEMES = {"int8": 8, "palette6": 6, "palette4": 4}  # bits per compressed weight
OVERHEAD = 0.12  # scales, lookup tables, tensors under 2048 elements, 64-byte alignment


@pytest.fixture(scope="module")
def variants(converted: Converted) -> dict[str, dict[str, Any]]:
    """fp16 (as converted) and each scheme applied to it: {variant: {stage: MLModel}}.

    Stages left out keep their float32 weights when the variants run in PyTorch."""
    ct = load_coremltools()
    specs = stage_specs(80, 192, harmonics=9)
    fp16 = {
        stage: ct.models.MLModel(
            str(converted.out_dir / specs[stage].package), skip_model_load=True
        )
        for stage in ALL_STAGES
    }
    result = {"fp16": fp16}
    for scheme in SCHEMES:
        result[scheme] = {
            stage: compress_model(model, scheme, "macOS14") if stage in COMPRESSED else model
            for stage, model in fp16.items()
        }
    return result


class VariantPrograms:
    """Each variant's MIL programs and decompressed weights, loaded once for the module's
    tests (~1 s per encoder program): a compressed stage from its saved package, the others
    from the session's fp16 conversion (the same package: compression leaves them as they are).
    """

    def __init__(self, variants: dict[str, dict[str, Any]], fp16: PackagePrograms, folder: Path):
        self.variants, self.fp16, self.folder = variants, fp16, folder
        self._programs: dict[tuple[str, str], Any] = {}
        self._weights: dict[tuple[str, str], dict[str, np.ndarray]] = {}

    def program(self, variant: str, stage: str) -> Any:
        if variant == "fp16" or stage not in COMPRESSED:
            return self.fp16[stage]
        if (variant, stage) not in self._programs:
            path = self.folder / variant / f"{stage}.mlpackage"
            self.variants[variant][stage].save(str(path))
            self._programs[variant, stage] = load_package_program(path)
        return self._programs[variant, stage]

    def weights(self, variant: str, stage: str) -> dict[str, np.ndarray]:
        if (variant, stage) not in self._weights:
            self._weights[variant, stage] = program_weights(self.program(variant, stage))
        return self._weights[variant, stage]


@pytest.fixture(scope="module")
def programs(
    variants: dict[str, dict[str, Any]],
    converted_programs: PackagePrograms,
    tmp_path_factory: pytest.TempPathFactory,
) -> VariantPrograms:
    return VariantPrograms(variants, converted_programs, tmp_path_factory.mktemp("variants"))


def weight_bytes(models: dict[str, Any], folder: Path) -> int:
    total = 0
    for stage in COMPRESSED:
        path = folder / f"{stage}.mlpackage"
        models[stage].save(str(path))
        total += (path / WEIGHTS_FILE).stat().st_size
    return total


def test_each_scheme_shrinks_fp16_weights_by_its_bit_width(
    variants: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    fp16 = weight_bytes(variants["fp16"], tmp_path / "fp16")
    for scheme, bits in SCHEMES.items():
        ratio = weight_bytes(variants[scheme], tmp_path / scheme) / fp16
        assert bits / 16 <= ratio <= bits / 16 + OVERHEAD, (scheme, ratio)


def test_decompressed_weights_run_in_pytorch_in_quality_order(
    programs: VariantPrograms, converted: Converted
) -> None:
    flow, hift = load_flow_and_hift(converted.model_dir, FLOW_STEPS)  # the CFM is not compressed
    mel_config = MelConfig.from_model_yaml(ModelDirectory(converted.model_dir).yaml)
    request = bench_request(flow, hift, tokens=40, prompt_tokens=10, seed=0)
    reference = synthesize(flow, hift, request)
    quality: dict[str, Quality] = {}
    for name in ("fp16", "int8", "palette4"):
        weights = {stage: programs.weights(name, stage) for stage in ALL_STAGES}
        flow_v, hift_v, covered = variant_modules(flow, hift, weights)
        quality[name] = measure(
            reference, flow_v, hift_v, request=request, mel_config=mel_config,
            weight_coverage=covered,
        )  # fmt: skip
        assert quality[name].finite
    assert quality["fp16"].snr_db > quality["int8"].snr_db > quality["palette4"].snr_db
    assert (
        quality["fp16"].flow_mel_l1 < quality["int8"].flow_mel_l1 < quality["palette4"].flow_mel_l1
    )


def test_fp16_weights_land_on_their_own_parameters(
    converted: Converted, converted_programs: PackagePrograms
) -> None:
    """Loading by name is exact: every loaded parameter is its float32 value rounded to fp16."""
    flow, _ = load_flow_and_hift(converted.model_dir)
    original = {n: p.clone() for n, p in flow.named_parameters()}
    loaded = load_into(flow_graphs(flow).encoder, program_weights(converted_programs[FLOW_ENCODER]))
    params = dict(flow.named_parameters())
    assert "flow.encoder.encoders.0.self_attn.linear_q.weight" in loaded
    assert "flow.input_embedding.weight" in loaded
    for name in loaded:
        key = name.removeprefix("flow.")
        assert torch.equal(params[key], original[key].half().float()), name


def test_int8_per_block_needs_macos15_and_runs() -> None:
    # the unbatched encoder (the graph its weights load into below): per-block scales are per
    # weight, and the batched program took ~60% longer to convert and compress; of the micro
    # flow with one block after the upsampling (the session model's four took twice as long)
    flow = random_flow(MICRO_FLOW)
    stage = convert_encoder(flow, ConvertOptions(target="macOS15", batch_sizes=(1,)))
    with pytest.raises(ValueError, match="needs --target macOS15"):
        compress_model(stage.model, "int8-block", "macOS14")
    blocked = compress_model(stage.model, "int8-block", "macOS15")
    weights = decompressed_weights(blocked)
    loaded = load_into(flow_graphs(flow).encoder, weights)
    assert "flow.input_embedding.weight" in loaded
    token = torch.randint(0, 6561, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        _, mu = flow.encode(token)
    assert torch.isfinite(mu).all()


@pytest.mark.parametrize("scheme", ["int8", "palette4"])
def test_a_compressed_program_computes_what_its_weights_give_in_pytorch(
    programs: VariantPrograms, converted: Converted, scheme: str
) -> None:
    """Run the compressed encoder program itself (as saved): it matches PyTorch carrying its
    weights."""
    flow, _ = load_flow_and_hift(converted.model_dir)
    graph = flow_graphs(flow, batched=True).encoder  # the session's conversion is batched
    load_into(graph, programs.weights(scheme, FLOW_ENCODER))
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 6561, (1, 40), generator=g, dtype=torch.int32)
    lengths = torch.tensor([40], dtype=torch.int32)
    embedding = torch.randn(1, 192, generator=g)
    with torch.inference_mode():
        mu, _ = graph(tokens, lengths, embedding)
    data = {"tokens": tokens.numpy(), "lengths": lengths.numpy(), "embedding": embedding.numpy()}
    out = MILPredictor.of_program(programs.program(scheme, FLOW_ENCODER)).predict(data)
    assert float(np.abs(out["mu"] - mu.numpy()).mean()) < 0.01 * float(mu.abs().mean())
