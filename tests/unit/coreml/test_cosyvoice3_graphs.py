"""CosyVoice 3's traced graphs reproduce the official CosyVoice 3 reference arrays.

As `test_graphs_reference` does for CosyVoice 2: the TorchScript traces handed to coremltools
(DiT encoder, CFM with the DiT, causal HiFT source with its float32 F0, decode), run through
the runtime's own packing (`CoreMLFlow`, `CoreMLCausalHiFT`), match the official outputs, so
CosyVoice 3's conversion starts from a faithful graph. Tracing only: no conversion here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.doubles.coreml_predictors import TorchPredictor
from workers.coreml.causal_runtime import CoreMLCausalHiFT
from workers.coreml.convert.cosyvoice3_graphs import BatchedDiTEncoderGraph
from workers.coreml.convert.graphs import flow_graphs, hift_graphs, pack_cfm_frames
from workers.coreml.convert.stages_convert import trace
from workers.coreml.runtime import CoreMLFlow
from workers.coreml.stages import FLOW_CFM, FLOW_ENCODER, HIFT_DECODE, HIFT_SOURCE, stage_specs
from workers.tools.reference.causal_hift import SOURCE_ATOL, WAV_ATOL, load_reference_causal_hift
from workers.tools.reference.dit_flow import load_reference_dit_flow
from workers.tools.reference.flow import INTERMEDIATE_TOL, MEL_TOL
from workers.tools.reference.parity import ReferenceSet

F0_FLOAT32_RTOL = 5e-4  # the reference README's tolerance for F0 computed in float32, not 64


@pytest.fixture(scope="module")
def ref(reference3_dir: Path) -> ReferenceSet:
    return ReferenceSet(reference3_dir)


def traced(graph: torch.nn.Module, *example: torch.Tensor) -> torch.jit.ScriptModule:
    return trace(graph, example, example)


def arrays(ref: ReferenceSet, name: str) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in ref.arrays(name).items()}


def test_traced_dit_flow_graphs_match_the_reference(ref: ReferenceSet) -> None:
    flow = load_reference_dit_flow(ref)
    a = arrays(ref, "flow_reference.npz")
    token, prompt_token, prompt_feat, embedding = (
        a[k] for k in ("token", "prompt_token", "prompt_feat", "embedding")
    )
    graphs = flow_graphs(flow)
    specs = stage_specs(80, 192, harmonics=1)
    tokens = torch.cat([prompt_token, token], dim=1)
    encoder = traced(graphs.encoder, tokens, embedding)
    mu, spks = encoder(tokens, embedding)
    torch.testing.assert_close(mu, a["mu"], atol=INTERMEDIATE_TOL, rtol=0)
    torch.testing.assert_close(spks, a["spk_proj"], atol=INTERMEDIATE_TOL, rtol=0)
    frames = 2 * tokens.size(1)
    cfm = traced(graphs.cfm, torch.zeros(1, 241, frames), torch.zeros(1, 80))
    stage = CoreMLFlow(
        flow.config,
        TorchPredictor(encoder, specs[FLOW_ENCODER]),
        TorchPredictor(cfm, specs[FLOW_CFM]),
    )
    with torch.no_grad():
        mel, _ = stage.inference(token, prompt_token, prompt_feat, embedding)
    assert mel.shape == a["mel_nonstream"].shape
    assert np.abs(mel.numpy() - a["mel_nonstream"].numpy()).max() <= MEL_TOL


def test_the_batched_dit_encoder_gives_each_padded_row_as_alone(ref: ReferenceSet) -> None:
    """Zeroed embeddings past a row's length are the zeros its look-ahead sees when alone."""
    flow = load_reference_dit_flow(ref)
    a = arrays(ref, "flow_reference.npz")
    tokens = torch.cat([a["prompt_token"], a["token"]], dim=1).int()
    short = tokens[:, :30]
    padded = torch.cat([tokens, torch.nn.functional.pad(short, (0, tokens.size(1) - 30), value=7)])
    embedding = a["embedding"].expand(2, -1)
    graph = traced(BatchedDiTEncoderGraph(flow), padded, torch.tensor([53, 30]).int(), embedding)
    mu, _ = graph(padded, torch.tensor([53, 30]).int(), embedding)
    alone, _ = flow_graphs(flow).encoder(short, a["embedding"])
    torch.testing.assert_close(mu[0:1], a["mu"], atol=INTERMEDIATE_TOL, rtol=0)
    torch.testing.assert_close(mu[1:, :, :60], alone, atol=1e-6, rtol=0)


def test_traced_causal_hift_graphs_match_the_reference(ref: ReferenceSet) -> None:
    hift = load_reference_causal_hift(ref)
    a = arrays(ref, "hift_reference.npz")
    mel, s_fixed = a["mel"], a["s_fixed"]
    graphs = hift_graphs(hift)
    specs = stage_specs(80, 1, harmonics=hift.m_source.harmonics)
    samples = mel.size(-1) * hift.config.base.samples_per_frame
    noise = hift.source_buffer.prefix(samples).transpose(1, 2)  # the fixed buffer's start
    source_graph = traced(graphs.source, mel, noise)
    decode_graph = traced(graphs.decode, mel, s_fixed)
    vocoder = CoreMLCausalHiFT(
        hift.config,
        TorchPredictor(source_graph, specs[HIFT_SOURCE]),
        TorchPredictor(decode_graph, specs[HIFT_DECODE]),
    )
    with torch.no_grad():
        out = vocoder.inference(mel)
        f0, scale = a["f0_f64"].float(), float(a["f0_f64"].abs().max())
        torch.testing.assert_close(out.f0 / scale, f0 / scale, atol=F0_FLOAT32_RTOL, rtol=0)
        torch.testing.assert_close(out.source, a["source"], atol=SOURCE_ATOL, rtol=0)
        torch.testing.assert_close(out.wav, a["wav"], atol=WAV_ATOL, rtol=0)
        wav_fixed = vocoder.decode(mel, s_fixed)
        torch.testing.assert_close(wav_fixed, a["wav_fixed"], atol=WAV_ATOL, rtol=0)


def test_padding_the_dit_cfm_to_a_bucket_keeps_the_real_frames(ref: ReferenceSet) -> None:
    """What `--flow-buckets` relies on: frames padded with mask 0 (the runtime's bucket
    padding) leave the DiT's real frames unchanged (causal position convs, masked keys)."""
    flow = load_reference_dit_flow(ref)
    a = arrays(ref, "flow_reference.npz")
    mask = torch.ones(1, 1, a["mu"].size(-1))
    frames = pack_cfm_frames(a["noise_z"], a["mu"], a["est_cond"][:1], mask)
    padded = torch.nn.functional.pad(frames, (0, 128 - frames.size(-1)))  # mask 0 past the end
    cfm = flow_graphs(flow).cfm
    with torch.no_grad():
        alone, bucketed = cfm(frames, a["spk_proj"]), cfm(padded, a["spk_proj"])
    torch.testing.assert_close(bucketed[:, :, : frames.size(-1)], alone, atol=1e-5, rtol=0)
