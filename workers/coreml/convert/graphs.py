"""The four traceable graphs we convert, built from our own flow and HiFT modules
(CosyVoice 3's encoder and HiFT graphs are in `cosyvoice3_graphs`).

Each wrapper holds the production module under one attribute (`flow`, `cfm` or `hift`), so the
Core ML constant names are that attribute path with dots as underscores; `compress` maps them
back to our parameters by that rule. The graphs:

- `FlowEncoderGraph`: prompt+target tokens (1, N) int32 and the speaker embedding (1, 192) ->
  mu (1, 80, 2N) and the projected speaker vector (1, 80). Non-streaming, finalize=True.
  `BatchedFlowEncoderGraph` takes B right-padded rows and their token counts, as
  `workers.model.flow.batch` runs the encoder: each row's frames as alone.
- `CfmGraph`: the 10-step Euler loop with classifier-free guidance, unrolled in the graph. Its
  per-frame inputs are packed into ONE tensor `frames` (1, 241, T) = [noise | mu | cond | mask]
  because macOS 14 allows at most one input with enumerated shapes (`--flow-buckets`).
- `HiFTSourceGraph`: mel (1, 80, T) and standard-normal noise (1, 9, 480·T) -> the excitation
  (1, 1, 480·T) and f0 (1, T). Always float32: its phase reaches ~4e3 rad, meaningless in fp16.
- `HiFTDecodeGraph`: mel and excitation -> waveform (1, 480·T) (DFT-basis iSTFT).
Splitting HiFT at the excitation also lets the runtime overwrite its start (streaming's
`source_prefix`) exactly as `HiFTGenerator.inference` does.
The CFM and HiFT graphs take any number of rows as they are (the CFM's CFG makes 2B estimator
rows; a row's mask 0 frames are padding); a batched conversion gives their first axis sizes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from workers.coreml.convert.cosyvoice3_graphs import (
    BatchedDiTEncoderGraph,
    CausalHiFTDecodeGraph,
    CausalHiFTSourceGraph,
    DiTEncoderGraph,
)
from workers.model.causal_hift.model import CausalHiFTGenerator
from workers.model.dit.model import CausalMaskedDiffWithDiT
from workers.model.flow.model import CausalMaskedDiffWithXvec, FlowMatchingSolver
from workers.model.hift.model import HiFTGenerator

# Channel layout of the CFM's packed `frames` input: (name, channels) in order.
CFM_FRAME_PARTS = ("noise", "mu", "cond", "mask")


def pack_cfm_frames(noise: Tensor, mu: Tensor, cond: Tensor, mask: Tensor) -> Tensor:
    """noise, mu, cond (1, 80, T) and mask (1, 1, T) -> frames (1, 241, T) in `CFM_FRAME_PARTS`."""
    return torch.cat([noise, mu, cond, mask], dim=1)


class FlowEncoderGraph(nn.Module):
    """Tokens and speaker embedding -> (mu, speaker vector), as `flow.inference` computes them."""

    def __init__(self, flow: CausalMaskedDiffWithXvec) -> None:
        super().__init__()
        self.flow = flow

    def forward(self, tokens: Tensor, embedding: Tensor) -> tuple[Tensor, Tensor]:
        """tokens (1, N) int32, embedding (1, 192) -> mu (1, 80, 2N), spks (1, 80)."""
        _, mu = self.flow.encode(tokens)
        return mu.transpose(1, 2), self.flow.project_speaker(embedding)


class BatchedFlowEncoderGraph(nn.Module):
    """B padded rows of tokens -> each row's (mu, speaker vector), as `batched_inference`."""

    def __init__(self, flow: CausalMaskedDiffWithXvec) -> None:
        super().__init__()
        self.flow = flow

    def forward(self, tokens: Tensor, lengths: Tensor, embedding: Tensor) -> tuple[Tensor, Tensor]:
        """tokens (B, N) int32, lengths (B,) int32 real tokens per row, embedding (B, 192) ->
        mu (B, 80, 2N) (a row's frames past 2·lengths are padding), spks (B, 80)."""
        h = self.flow.embed_tokens(tokens, lengths)
        mu = self.flow.encoder_proj(self.flow.encoder(h, None, False, lengths))
        return mu.transpose(1, 2), self.flow.project_speaker(embedding)


class CfmGraph(nn.Module):
    """The CFM solver's `forward` (CosyVoice 2's U-Net or 3's DiT) with its frame inputs packed
    into one tensor."""

    def __init__(self, cfm: FlowMatchingSolver, mel_bins: int) -> None:
        super().__init__()
        self.cfm = cfm
        self.mel_bins = mel_bins

    def forward(self, frames: Tensor, spks: Tensor) -> Tensor:
        """frames (1, 3·80+1, T) = [noise | mu | cond | mask], spks (1, 80) -> mel (1, 80, T)."""
        m = self.mel_bins
        noise, mu = frames[:, :m], frames[:, m : 2 * m]
        cond, mask = frames[:, 2 * m : 3 * m], frames[:, 3 * m :]
        return self.cfm(noise, mu, mask, spks, cond)


class HiFTSourceGraph(nn.Module):
    """F0 predictor and sine source: the part of HiFT that must stay float32."""

    def __init__(self, hift: HiFTGenerator) -> None:
        super().__init__()
        self.hift = hift

    def forward(self, mel: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """mel (1, 80, T), noise (1, 9, 480·T) -> source (1, 1, 480·T), f0 (1, T)."""
        f0 = self.hift.f0_predictor(mel)
        return self.hift.m_source(f0, noise), f0


class HiFTDecodeGraph(nn.Module):
    """Source STFT, upsampling network and the DFT-basis inverse STFT."""

    def __init__(self, hift: HiFTGenerator) -> None:
        super().__init__()
        self.hift = hift

    def forward(self, mel: Tensor, source: Tensor) -> Tensor:
        """mel (1, 80, T), source (1, 1, 480·T) -> wav (1, 480·T) in [-0.99, 0.99]."""
        return self.hift.decode(mel, source)


@dataclass(frozen=True)
class FlowGraphs:
    encoder: nn.Module  # (Batched)FlowEncoderGraph, or CosyVoice 3's (Batched)DiTEncoderGraph
    cfm: CfmGraph


@dataclass(frozen=True)
class HiFTGraphs:
    source: nn.Module  # HiFTSourceGraph, or CosyVoice 3's CausalHiFTSourceGraph
    decode: nn.Module  # HiFTDecodeGraph, or CausalHiFTDecodeGraph


def flow_graphs(
    flow: CausalMaskedDiffWithXvec | CausalMaskedDiffWithDiT, *, batched: bool = False
) -> FlowGraphs:
    """The flow's two graphs, sharing `flow`'s parameters (eval mode, no grad); `batched`: the
    encoder that takes padded rows and their lengths. A CosyVoice 3 flow gets its DiT graphs."""
    flow.eval().requires_grad_(False)
    encoder: nn.Module
    if isinstance(flow, CausalMaskedDiffWithDiT):
        encoder = BatchedDiTEncoderGraph(flow) if batched else DiTEncoderGraph(flow)
    else:
        encoder = BatchedFlowEncoderGraph(flow) if batched else FlowEncoderGraph(flow)
    return FlowGraphs(encoder, CfmGraph(flow.decoder, flow.config.mel_bins))


def hift_graphs(hift: HiFTGenerator | CausalHiFTGenerator) -> HiFTGraphs:
    """HiFT's two graphs, sharing `hift`'s parameters (weight norm must already be folded);
    CosyVoice 3's causal HiFT gets its own (float32 F0, the fixed buffer as `noise`)."""
    hift.eval().requires_grad_(False)
    if isinstance(hift, CausalHiFTGenerator):
        return HiFTGraphs(CausalHiFTSourceGraph(hift), CausalHiFTDecodeGraph(hift))
    return HiFTGraphs(HiFTSourceGraph(hift), HiFTDecodeGraph(hift))
