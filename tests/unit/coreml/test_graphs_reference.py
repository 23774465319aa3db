"""The traced graphs Core ML converts reproduce the official reference arrays.

`reference_hift` and `reference_flow` prove our eager modules (DFT-basis iSTFT, frame-rate sine
source, flow) match upstream; these tests prove the same of the TorchScript traces handed to
coremltools, through the runtime's own packing, so conversion starts from a faithful graph.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.doubles.coreml_predictors import TorchPredictor
from workers.coreml.convert.graphs import flow_graphs, hift_graphs
from workers.coreml.convert.stages_convert import trace
from workers.coreml.runtime import CoreMLFlow, CoreMLHiFT
from workers.coreml.stages import FLOW_CFM, FLOW_ENCODER, HIFT_DECODE, HIFT_SOURCE, stage_specs
from workers.model.checkpoint import read_state_dict
from workers.model.flow.model import build_flow
from workers.tools.reference.configs import flow_config_from_reference
from workers.tools.reference.flow import MEL_TOL
from workers.tools.reference.hift import (
    SOURCE_ATOL,
    WAV_ATOL,
    _stored_noise,  # the stored draws as our inputs; shared with the HiFT parity check
    load_reference_hift,
)
from workers.tools.reference.parity import ReferenceSet


@pytest.fixture(scope="module")
def ref(reference_dir: Path) -> ReferenceSet:
    return ReferenceSet(reference_dir)


def traced(graph: torch.nn.Module, *example: torch.Tensor) -> torch.jit.ScriptModule:
    return trace(graph, example, example)


def test_traced_hift_graphs_match_the_reference(ref: ReferenceSet) -> None:
    hift = load_reference_hift(ref, torch.device("cpu"))
    arrays = {k: torch.from_numpy(v) for k, v in ref.arrays("hift_reference.npz").items()}
    mel, s_fixed = arrays["mel"], arrays["s_fixed"]
    normal = _stored_noise(hift, arrays, torch.device("cpu")).normal
    graphs = hift_graphs(hift)
    specs = stage_specs(80, 1, harmonics=hift.m_source.harmonics)
    source_graph = traced(graphs.source, mel, normal)
    decode_graph = traced(graphs.decode, mel, s_fixed)
    vocoder = CoreMLHiFT(
        hift.config,
        TorchPredictor(source_graph, specs[HIFT_SOURCE]),
        TorchPredictor(decode_graph, specs[HIFT_DECODE]),
    )
    with torch.no_grad():
        source, _ = vocoder.excitation(mel, normal)
        torch.testing.assert_close(source, arrays["infer_source"], atol=SOURCE_ATOL, rtol=0)
        wav_fixed = vocoder.decode(mel, s_fixed)
        torch.testing.assert_close(wav_fixed, arrays["wav_fixed"], atol=WAV_ATOL, rtol=0)
        wav = vocoder.forward(mel, normal)
        torch.testing.assert_close(wav, arrays["infer_wav"], atol=WAV_ATOL, rtol=0)


def test_traced_flow_graphs_match_the_reference(ref: ReferenceSet) -> None:
    flow = build_flow(
        flow_config_from_reference(ref.config, "tiny"), read_state_dict(ref.checkpoint("flow"))
    )
    arrays = ref.arrays("flow_reference.npz")
    token, prompt_token, prompt_feat, embedding = (
        torch.from_numpy(arrays[k]) for k in ("token", "prompt_token", "prompt_feat", "embedding")
    )
    graphs = flow_graphs(flow)
    specs = stage_specs(80, 192, harmonics=1)
    tokens = torch.cat([prompt_token, token], dim=1)
    frames = 2 * tokens.size(1)
    encoder = traced(graphs.encoder, tokens, embedding)
    cfm = traced(graphs.cfm, torch.zeros(1, 241, frames), torch.zeros(1, 80))
    stage = CoreMLFlow(
        flow.config,
        TorchPredictor(encoder, specs[FLOW_ENCODER]),
        TorchPredictor(cfm, specs[FLOW_CFM]),
    )
    with torch.no_grad():
        mel, _ = stage.inference(token, prompt_token, prompt_feat, embedding)
    assert mel.shape == arrays["mel_nonstream"].shape
    assert np.abs(mel.numpy() - arrays["mel_nonstream"]).max() <= MEL_TOL
