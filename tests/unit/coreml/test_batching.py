"""Batched Core ML stages on Linux, PyTorch standing in for Core ML (no prediction here).

The predictors run the very graphs a batched conversion converts, so these pin down what the
runtime does around a call: rows split into calls of the package's batch sizes, a call filled
up to its size and the filler dropped, rows padded to the longest (flow) or grouped by length
(HiFT), each row as alone; the engine's batch session using those calls; and the LLM staying
on PyTorch (batched) when a worker runs several jobs at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.doubles.coreml_predictors import TorchPredictor, TorchStatefulPredictor
from tests.unit.coreml.micro import flow_row
from workers.coreml.batch_sizes import BatchSizes, Group
from workers.coreml.convert.build import load_flow_and_hift
from workers.coreml.convert.graphs import flow_graphs, hift_graphs
from workers.coreml.convert.llm_graph import StatefulLLMGraph
from workers.coreml.engine import CoreMLPlacement, coreml_engine
from workers.coreml.llm_runtime import CoreMLQwen2LM, embeddings_only
from workers.coreml.loader import CoreMLStages
from workers.coreml.manifest import Manifest
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
from workers.engine.api import SynthesisInput, SynthesisOutput, VoicePrompt
from workers.engine.batch_session import PipelineBatchSession
from workers.engine.batching import SequentialSession
from workers.engine.pipeline import EngineOptions
from workers.engine.stages import ModuleVocoder
from workers.engine.text_split import SplitConfig
from workers.model.checkpoint import read_state_dict
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.model.hift.model import HiFTGenerator
from workers.model.hift.source import draw_source_noise
from workers.model.llm.model import Qwen2LM
from workers.model.loader import load_model

pytestmark = pytest.mark.timeout(600)
Modules = tuple[CausalMaskedDiffWithXvec, HiFTGenerator]
SIZES = (1, 2, 4)
FP32 = {"atol": 1e-5, "rtol": 1e-5}  # as the batch-1 runtime tests compare fp32 outputs


@pytest.fixture(scope="module")
def modules(micro_model_dir: Path) -> Modules:
    return load_flow_and_hift(micro_model_dir)


def batched_flow(flow: CausalMaskedDiffWithXvec, buckets: tuple[int, ...] = ()) -> CoreMLFlow:
    specs = stage_specs(flow.config.mel_bins, flow.config.spk_embed_dim, 1, batched=True)
    graphs = flow_graphs(flow, batched=True)
    return CoreMLFlow(
        flow.config,
        TorchPredictor(graphs.encoder, specs[FLOW_ENCODER]),
        TorchPredictor(graphs.cfm, specs[FLOW_CFM]),
        buckets=buckets,
        batch_sizes=SIZES,
    )


def batched_hift(hift: HiFTGenerator) -> CoreMLHiFT:
    specs = stage_specs(hift.config.in_channels, 1, hift.m_source.harmonics, batched=True)
    graphs = hift_graphs(hift)
    return CoreMLHiFT(
        hift.config,
        TorchPredictor(graphs.source, specs[HIFT_SOURCE]),
        TorchPredictor(graphs.decode, specs[HIFT_DECODE]),
        batch_sizes=SIZES,
    )


def calls(predictor: Any, name: str) -> list[int]:
    """The rows of each call a TorchPredictor received (input `name`'s first axis)."""
    assert isinstance(predictor, TorchPredictor)
    return [shape[name][0] for shape in predictor.calls]


def test_rows_are_split_into_calls_of_the_largest_size_and_padded_up() -> None:
    sizes = BatchSizes((1, 2, 4, 8))
    assert [sizes.padded(n) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert sizes.groups(3) == [Group(0, 3, 4)]
    assert sizes.groups(13) == [Group(0, 8, 8), Group(8, 5, 8)]
    assert BatchSizes((1, 2, 4)).groups(5) == [Group(0, 4, 4), Group(4, 1, 1)]
    assert BatchSizes().groups(2) == [Group(0, 1, 1), Group(1, 1, 1)]  # unbatched: one by one
    assert not BatchSizes().batched and sizes.batched


def test_a_size_the_package_lacks_is_refused_by_name(modules: Modules) -> None:
    flow, _ = modules
    stage = batched_flow(flow)
    tokens, embedding = torch.zeros(3, 5, dtype=torch.int32), torch.ones(3, 192)
    with pytest.raises(ValueError, match=r"flow_encoder: no batch size 3 .*has 1, 2, 4\)"):
        stage.encode(tokens, embedding)
    with pytest.raises(ValueError, match="strictly increasing integers from 1"):
        BatchSizes((2, 4))


@torch.inference_mode()
def test_flow_rows_padded_and_split_come_out_as_each_alone(modules: Modules) -> None:
    flow, _ = modules
    stage = batched_flow(flow)
    sizes = [(30, 12), (9, 5), (22, 20), (14, 3), (40, 8), (7, 7)]  # (tokens, prompt tokens)
    rows = [flow_row(t, p, seed) for seed, (t, p) in enumerate(sizes)]
    mels = stage.batched_inference(rows)
    assert calls(stage.encoder, "tokens") == calls(stage.cfm, "frames") == [4, 2]  # 6 = 4 + 2
    for row, mel in zip(rows, mels, strict=True):
        alone, _ = flow.inference(row.token, row.prompt_token, row.prompt_feat, row.embedding)
        assert mel.shape == alone[0].shape
        torch.testing.assert_close(mel, alone[0], **FP32)
    three = stage.batched_inference(rows[:3])  # padded to 4 with a filler row, dropped
    assert calls(stage.cfm, "frames")[-1] == 4 and len(three) == 3
    for got, want in zip(three, mels[:3], strict=True):
        torch.testing.assert_close(got, want, **FP32)


@torch.inference_mode()
def test_flow_rows_with_buckets_pad_frames_and_rows(modules: Modules) -> None:
    flow, _ = modules
    stage = batched_flow(flow, buckets=(64, 128))
    rows = [flow_row(20, 10, 1), flow_row(30, 12, 2), flow_row(8, 4, 3)]
    mels = stage.batched_inference(rows)
    assert stage.cfm.calls[-1]["frames"] == (4, 241, 128)  # type: ignore[attr-defined]
    for row, mel in zip(rows, mels, strict=True):
        alone, _ = flow.inference(row.token, row.prompt_token, row.prompt_feat, row.embedding)
        torch.testing.assert_close(mel, alone[0], atol=2e-5, rtol=1e-4)  # as bucket padding


@torch.inference_mode()
def test_vocoder_rows_of_equal_length_share_calls_each_as_alone(modules: Modules) -> None:
    _, hift = modules
    stage = batched_hift(hift)
    lengths = [20, 14, 20, 20, 20, 20, 14]  # five of 20 frames -> 4 + 1; two of 14 -> 2
    g = torch.Generator().manual_seed(5)
    mels = [torch.randn(1, 80, t, generator=g) for t in lengths]
    noises = [draw_source_noise(1, 9, 480 * t, generator=g) for t in lengths]
    wavs = stage.batched_inference(mels, noises)
    assert calls(stage.source, "mel") == calls(stage.decode_model, "mel") == [4, 1, 2]
    for mel, noise, wav in zip(mels, noises, wavs, strict=True):
        torch.testing.assert_close(wav, hift.inference(mel, noise=noise).wav, **FP32)


def micro_prompt() -> VoicePrompt:
    return VoicePrompt(
        speech_tokens=np.arange(10, dtype=np.int32),
        mel=np.full((20, 80), -5.0, dtype=np.float32),
        embedding=np.ones(192, dtype=np.float32),
        transcript="a prompt",
    )


def coreml_llm(model_dir: Path) -> CoreMLQwen2LM:
    llm = load_model(model_dir).llm
    specs = llm_specs(llm.config.backbone.hidden_size, llm.config.decoder_size)
    graph = StatefulLLMGraph(llm, 512)
    return CoreMLQwen2LM(
        llm.config,
        embeddings_only(llm.config, read_state_dict(model_dir / "llm.pt")),
        TorchStatefulPredictor(graph, specs[LLM_PREFILL]),
        TorchStatefulPredictor(graph, specs[LLM_DECODE]),
        capacity=512,
    )


@pytest.fixture(scope="module")
def stages(micro_model_dir: Path, modules: Modules) -> CoreMLStages:
    """Batched flow and HiFT stand-ins and a converted (stateful) LLM stand-in."""
    flow, hift = modules
    manifest = Manifest("micro", {}, {}, "fp32", "none", "macOS15", "CPU_ONLY", packages={})
    return CoreMLStages(
        batched_flow(flow), batched_hift(hift), manifest, "CPU_ONLY", coreml_llm(micro_model_dir)
    )


PLACEMENT = CoreMLPlacement("cpu", "cpu", "CPU_ONLY", Path("unused-coreml-dir"))


def run_together(engine: Any, requests: list[SynthesisInput]) -> list[SynthesisOutput]:
    session = engine.open_batch_session(len(requests))
    assert isinstance(session, PipelineBatchSession)
    futures = [session.submit(request) for request in requests]
    try:
        return [future.result(timeout=600) for future in futures]
    finally:
        session.close()


def test_a_batching_worker_runs_the_llm_on_torch_and_batches_flow_and_hift(
    micro_model_dir: Path, stages: CoreMLStages
) -> None:
    placement = PLACEMENT
    alone_engine = coreml_engine(micro_model_dir, placement, stages)  # batch 1: Core ML LLM
    assert isinstance(alone_engine.llm.model, CoreMLQwen2LM)  # type: ignore[attr-defined]
    assert isinstance(alone_engine.open_batch_session(1), SequentialSession)
    options = EngineOptions(
        split=SplitConfig(max_piece_tokens=12, min_tail_tokens=0), forced_speech_tokens=20
    )
    engine = coreml_engine(micro_model_dir, placement, stages, batch_size=3, options=options)
    assert isinstance(engine.llm.model, Qwen2LM)  # type: ignore[attr-defined]
    assert (engine.identity.backend, engine.identity.device) == ("coreml", "cpu")
    prompt = micro_prompt()
    requests = [
        SynthesisInput(text="Hello there, world.", prompt=prompt, seed=1),
        SynthesisInput(text="Another one. And more.", prompt=prompt, seed=2),
        SynthesisInput(text="Short.", prompt=prompt, seed=3, speed=1.5),
    ]
    before = len(stages.flow.cfm.calls), len(stages.hift.source.calls)  # type: ignore[attr-defined]
    outputs = run_together(engine, requests)
    cfm_rows = calls(stages.flow.cfm, "frames")[before[0] :]
    vocoder_rows = calls(stages.hift.source, "mel")[before[1] :]
    assert 4 in cfm_rows  # three first pieces, padded to the batch size 4
    assert 2 in vocoder_rows  # the two at speed 1 have equal lengths: one call
    for request, output in zip(requests, outputs, strict=True):
        alone = engine.synthesize(request)
        assert output.speech_tokens == alone.speech_tokens > 0
        np.testing.assert_allclose(output.samples, alone.samples, atol=1e-4)


def test_a_failing_batched_vocoder_call_reruns_each_piece_on_its_draws(
    micro_model_dir: Path,
    stages: CoreMLStages,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    placement = PLACEMENT
    options = EngineOptions(forced_speech_tokens=20)
    engine = coreml_engine(micro_model_dir, placement, stages, batch_size=2, options=options)
    vocoder = engine.vocoder
    assert isinstance(vocoder, ModuleVocoder) and vocoder.batches

    raised: list[int] = []

    def broken(mels: list[np.ndarray], _noises: Any) -> list[np.ndarray]:
        raised.append(len(mels))
        raise RuntimeError("batched vocoder blew up")

    monkeypatch.setattr(vocoder, "waveforms", broken)
    prompt = micro_prompt()
    requests = [SynthesisInput(text="Hello.", prompt=prompt, seed=s) for s in (4, 5)]
    outputs = run_together(engine, requests)
    assert raised and max(raised) == 2
    for request, output in zip(requests, outputs, strict=True):
        np.testing.assert_allclose(output.samples, engine.synthesize(request).samples, atol=1e-4)


def test_warm_up_runs_every_batch_size(modules: Modules) -> None:
    flow, hift = modules
    manifest = Manifest("micro", {}, {}, "fp32", "none", "macOS14", "ALL", packages={})
    stages = CoreMLStages(batched_flow(flow), batched_hift(hift), manifest, "ALL")
    stages.warm_up()
    assert calls(stages.flow.cfm, "frames") == [1, 2, 4]
    assert calls(stages.hift.decode_model, "mel") == [1, 2, 4]
