"""CosyVoice 3's traceable graphs: the DiT flow's token front and the causal HiFT's source.

The packages have CosyVoice 2's names, inputs and outputs (`stages.stage_specs`), so the runtime
packs, pads and crops the same way; what differs is inside:

- `DiTEncoderGraph`: tokens (1, N) int32, speaker embedding (1, 192) -> mu (1, 80, 2N) and the
  projected speaker vector (1, 80): token table (straight into 80 mel bins), the pre-look-ahead
  convs seeing zeros past the end (finalize=True), each frame repeated `token_mel_ratio` times.
  `BatchedDiTEncoderGraph` zeroes each row's embeddings past its token count, so the look-ahead
  of a right-padded row sees the zeros it would see alone.
- The CFM is `graphs.CfmGraph` unchanged: `DiTFlowMatching` is CosyVoice 2's solver around the
  DiT, with the same `forward(noise, mu, mask, spks, cond)`. The DiT's convs are causal and its
  attention masks padded keys, so a right-padded row (mask 0) leaves the real frames unchanged.
- `CausalHiFTSourceGraph`: mel (1, 80, T) and the fixed uniform buffer's first 480·T samples
  (1, 9, 480·T) -> the excitation and f0. Upstream computes F0 in float64, which Core ML does
  not have: the graph holds a float32 copy of the F0 predictor (README of the CosyVoice 3
  reference: 1.8e-4 Hz off, relative 1.1e-4). The buffer is an input, as CosyVoice 2's noise
  is, so a Mac can compare Core ML with PyTorch on equal inputs.
- `CausalHiFTDecodeGraph`: `CausalHiFTGenerator.decode(mel, source)` with finalize=True.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from workers.model.causal_hift.model import CausalHiFTGenerator
from workers.model.dit.model import CausalMaskedDiffWithDiT


def repeat_frames(x: Tensor, ratio: int) -> Tensor:
    """(B, N, C) -> (B, ratio·N, C), each frame `ratio` times (a reshape, not repeat_interleave,
    whose traced repeat count coremltools cannot take with a flexible N)."""
    return x.unsqueeze(2).expand(-1, -1, ratio, -1).flatten(1, 2)


class DiTEncoderGraph(nn.Module):
    """Tokens and speaker embedding -> (mu, speaker vector), as the DiT flow's `inference`."""

    def __init__(self, flow: CausalMaskedDiffWithDiT) -> None:
        super().__init__()
        self.flow = flow

    def forward(self, tokens: Tensor, embedding: Tensor) -> tuple[Tensor, Tensor]:
        """tokens (1, N) int32, embedding (1, 192) -> mu (1, 80, 2N), spks (1, 80)."""
        flow = self.flow
        embedded = flow.input_embedding(torch.clamp(tokens, min=0))
        out = flow.pre_lookahead_layer(embedded)
        mu = repeat_frames(out, flow.config.token_mel_ratio).transpose(1, 2)
        return mu, flow.project_speaker(embedding)


class BatchedDiTEncoderGraph(nn.Module):
    """B right-padded rows of tokens -> each row's (mu, speaker vector) as it would be alone."""

    def __init__(self, flow: CausalMaskedDiffWithDiT) -> None:
        super().__init__()
        self.flow = flow

    def forward(self, tokens: Tensor, lengths: Tensor, embedding: Tensor) -> tuple[Tensor, Tensor]:
        """tokens (B, N) int32, lengths (B,) int32, embedding (B, 192) -> mu (B, 80, 2N) (a
        row's frames past 2·lengths are padding), spks (B, 80)."""
        flow = self.flow
        positions = torch.arange(tokens.size(1), dtype=torch.int32)
        real = (positions.unsqueeze(0) < lengths.unsqueeze(1)).unsqueeze(-1)  # (B, N, 1)
        embedded = flow.input_embedding(torch.clamp(tokens, min=0)) * real.float()
        out = flow.pre_lookahead_layer(embedded)
        mu = repeat_frames(out, flow.config.token_mel_ratio).transpose(1, 2)
        return mu, flow.project_speaker(embedding)


class CausalHiFTSourceGraph(nn.Module):
    """The causal F0 predictor (a float32 copy) and the sine source on the fixed buffer."""

    def __init__(self, hift: CausalHiFTGenerator) -> None:
        super().__init__()
        self.hift = hift
        self.f0_predictor = copy.deepcopy(hift.f0_predictor).float()

    def forward(self, mel: Tensor, noise: Tensor) -> tuple[Tensor, Tensor]:
        """mel (B, 80, T), noise (B, 9, 480·T) uniform [0, 1) -> source (B, 1, 480·T), f0."""
        f0 = self.f0_predictor(mel.float(), True)
        return self.hift.m_source(f0, noise), f0


class CausalHiFTDecodeGraph(nn.Module):
    """Source STFT, the causal upsampling network and the DFT-basis inverse STFT."""

    def __init__(self, hift: CausalHiFTGenerator) -> None:
        super().__init__()
        self.hift = hift

    def forward(self, mel: Tensor, source: Tensor) -> Tensor:
        """mel (B, 80, T), source (B, 1, 480·T) -> wav (B, 480·T) in [-0.99, 0.99]."""
        return self.hift.decode(mel, source)
