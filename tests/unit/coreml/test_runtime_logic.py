"""CoreMLFlow / CoreMLHiFT call logic on Linux, with PyTorch standing in for Core ML.

The predictors run the very graphs we convert, so these tests pin down everything the runtime
does around a package call: token and frame packing, bucket padding with mask 0 and cropping,
the fixed noise, the prompt condition, request checks, source noise and source_prefix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from shared.errors import InvalidRequestError
from tests.doubles.coreml_predictors import TorchPredictor, TorchStatefulPredictor
from tests.unit.coreml.micro import Converted
from workers.coreml.convert.build import load_flow_and_hift
from workers.coreml.convert.graphs import flow_graphs, hift_graphs
from workers.coreml.convert.llm_graph import StatefulLLMGraph
from workers.coreml.engine import CoreMLPlacement, coreml_engine
from workers.coreml.llm_runtime import CoreMLQwen2LM, embeddings_only
from workers.coreml.loader import CoreMLStages
from workers.coreml.runtime import CoreMLFlow, CoreMLHiFT
from workers.coreml.stages import (
    FLOW_CFM,
    FLOW_ENCODER,
    HIFT_DECODE,
    HIFT_SOURCE,
    LLM_DECODE,
    LLM_PREFILL,
    llm_specs,
    stage_specs,
)
from workers.engine.api import SynthesisInput, VoicePrompt
from workers.engine.pipeline import build_engine
from workers.model.checkpoint import read_state_dict
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.model.hift.model import HiFTGenerator
from workers.model.hift.source import draw_source_noise
from workers.model.loader import load_model

Modules = tuple[CausalMaskedDiffWithXvec, HiFTGenerator]


@pytest.fixture(scope="module")
def modules(micro_model_dir: Path) -> Modules:
    return load_flow_and_hift(micro_model_dir)


def coreml_flow(flow: CausalMaskedDiffWithXvec, buckets: tuple[int, ...] = ()) -> CoreMLFlow:
    specs = stage_specs(flow.config.mel_bins, flow.config.spk_embed_dim, harmonics=1)
    graphs = flow_graphs(flow)
    return CoreMLFlow(
        flow.config,
        TorchPredictor(graphs.encoder, specs[FLOW_ENCODER]),
        TorchPredictor(graphs.cfm, specs[FLOW_CFM]),
        buckets=buckets,
    )


def coreml_hift(hift: HiFTGenerator) -> CoreMLHiFT:
    specs = stage_specs(hift.config.in_channels, 1, harmonics=hift.m_source.harmonics)
    graphs = hift_graphs(hift)
    return CoreMLHiFT(
        hift.config,
        TorchPredictor(graphs.source, specs[HIFT_SOURCE]),
        TorchPredictor(graphs.decode, specs[HIFT_DECODE]),
    )


def flow_request(tokens: int = 30, prompt: int = 12, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randint(0, 6561, (1, tokens), generator=g, dtype=torch.int32),
        torch.randint(0, 6561, (1, prompt), generator=g, dtype=torch.int32),
        torch.randn(1, 2 * prompt, 80, generator=g),
        torch.randn(1, 192, generator=g),
    )


@torch.inference_mode()
def test_flow_matches_the_torch_flow(modules: Modules) -> None:
    flow, _ = modules
    request = flow_request()
    expected, _ = flow.inference(*request)
    stages: list[str] = []
    mel, _ = coreml_flow(flow).inference(*request, stage_done=stages.append)
    assert mel.shape == expected.shape == (1, 80, 60)
    torch.testing.assert_close(mel, expected, atol=1e-5, rtol=1e-5)
    assert stages == ["encoder", "cfm"]


@torch.inference_mode()
def test_bucket_padding_leaves_the_real_frames_unchanged(modules: Modules) -> None:
    flow, _ = modules
    request = flow_request()  # 2 * (30 + 12) = 84 frames -> bucket 128
    flexible, _ = coreml_flow(flow).inference(*request)
    bucketed_flow = coreml_flow(flow, buckets=(64, 128, 256))
    bucketed, _ = bucketed_flow.inference(*request)
    cfm = bucketed_flow.cfm
    assert isinstance(cfm, TorchPredictor)
    assert cfm.calls[-1]["frames"] == (1, 241, 128)
    torch.testing.assert_close(bucketed, flexible, atol=2e-5, rtol=1e-4)


def test_frames_beyond_the_largest_bucket_are_refused(modules: Modules) -> None:
    flow, _ = modules
    with pytest.raises(
        InvalidRequestError, match=r"84 mel frames .* largest Core ML shape bucket \(64\)"
    ):
        coreml_flow(flow, buckets=(32, 64)).inference(*flow_request())


def test_requests_are_checked_like_the_torch_flow(modules: Modules) -> None:
    flow, _ = modules
    token, prompt_token, _, embedding = flow_request()
    bad_feat = torch.zeros(1, 5, 80)
    with pytest.raises(InvalidRequestError, match="flow prompt_feat: expected shape"):
        coreml_flow(flow).inference(token, prompt_token, bad_feat, embedding)
    with pytest.raises(ValueError, match="non-streaming path only"):
        coreml_flow(flow).inference(*flow_request(), streaming=True)


@torch.inference_mode()
def test_hift_matches_the_torch_vocoder_on_equal_draws(modules: Modules) -> None:
    _, hift = modules
    mel = torch.randn(1, 80, 30, generator=torch.Generator().manual_seed(1))
    noise = draw_source_noise(1, 9, 30 * 480, generator=torch.Generator().manual_seed(2))
    expected = hift.inference(mel, noise=noise)
    got = coreml_hift(hift).inference(mel, noise=noise)
    torch.testing.assert_close(got.wav, expected.wav, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got.f0, expected.f0)
    seeded = coreml_hift(hift).inference(mel, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(seeded.wav, expected.wav, atol=1e-5, rtol=1e-5)


@torch.inference_mode()
def test_hift_source_prefix_overwrites_the_excitation_start(modules: Modules) -> None:
    _, hift = modules
    mel = torch.randn(1, 80, 20, generator=torch.Generator().manual_seed(3))
    noise = draw_source_noise(1, 9, 20 * 480, generator=torch.Generator().manual_seed(4))
    prefix = torch.full((1, 1, 480), 0.25)
    expected = hift.inference(mel, noise=noise, source_prefix=prefix)
    got = coreml_hift(hift).inference(mel, noise=noise, source_prefix=prefix)
    assert torch.equal(got.source[:, :, :480], prefix)
    torch.testing.assert_close(got.wav, expected.wav, atol=1e-5, rtol=1e-5)


def test_warm_up_runs_every_package_and_every_bucket(
    modules: Modules, converted: Converted
) -> None:
    flow, hift = modules
    stages = CoreMLStages(
        coreml_flow(flow, buckets=(128, 256, 512)), coreml_hift(hift), converted.manifest, "ALL"
    )
    stages.warm_up()
    cfm, source = stages.flow.cfm, stages.hift.source
    assert isinstance(cfm, TorchPredictor) and isinstance(source, TorchPredictor)
    assert [call["frames"][-1] for call in cfm.calls] == [128, 128, 256, 512]
    assert len(source.calls) == 1
    assert stages.device == "ane/gpu/cpu"


def test_the_engine_on_core_ml_stages_synthesizes_like_the_torch_engine(
    micro_model_dir: Path, converted: Converted, modules: Modules
) -> None:
    """The real pipeline with the Core ML stand-ins (run by PyTorch here), LLM included."""
    flow, hift = modules
    llm = load_model(micro_model_dir).llm
    specs = llm_specs(llm.config.backbone.hidden_size, llm.config.decoder_size)
    graph = StatefulLLMGraph(llm, 512)
    coreml_llm = CoreMLQwen2LM(
        llm.config,
        embeddings_only(llm.config, read_state_dict(micro_model_dir / "llm.pt")),
        TorchStatefulPredictor(graph, specs[LLM_PREFILL]),
        TorchStatefulPredictor(graph, specs[LLM_DECODE]),
        capacity=512,
    )
    stages = CoreMLStages(
        coreml_flow(flow), coreml_hift(hift), converted.manifest, "CPU_ONLY", coreml_llm
    )
    placement = CoreMLPlacement("cpu", "cpu", "CPU_ONLY", converted.out_dir)
    engine = coreml_engine(micro_model_dir, placement, stages)
    assert (engine.identity.backend, engine.identity.device) == ("coreml", "cpu")
    reference = build_engine(micro_model_dir, device="cpu")
    prompt = VoicePrompt(
        speech_tokens=np.arange(10, dtype=np.int32),
        mel=np.full((20, 80), -5.0, dtype=np.float32),
        embedding=np.ones(192, dtype=np.float32),
        transcript="a prompt",
    )
    request = SynthesisInput(text="Hello there, world.", prompt=prompt, seed=3)
    ours, theirs = engine.synthesize(request), reference.synthesize(request)
    assert ours.speech_tokens == theirs.speech_tokens > 0
    np.testing.assert_allclose(ours.samples, theirs.samples, atol=1e-4)
