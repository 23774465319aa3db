"""The U-Net estimator over a streamed pass's new frames, at one Euler step (`EstimatorStream`).

The same arithmetic as `CausalConditionalDecoder.forward(streaming=True)` for one request whose
mask is all ones, position by position: every conv is causal (its kernel-1 earlier inputs come
from the step's `LayerCache`), every norm is per frame (LayerNorm over channels), the time and
speaker conditions are per row, the skip connection joins the same frames, and attention reads
the kept keys/values of earlier frames plus the new ones under the static chunk mask. One
instance per Euler step: each step sees a different x, so each keeps its own.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workers.model.cpu_attention import KeyLimits, attention_over
from workers.model.flow.estimator import (
    CausalBlock1D,
    CausalConditionalDecoder,
    CausalResnetBlock1D,
    SelfAttention,
    TransformerBlock,
    UNetStage,
    timestep_embedding,
)
from workers.model.flow.stream_layers import CacheBudget, LayerCache, Span, key_limits


class EstimatorStream:
    """One Euler step's estimator with its cache; `span` (mel frames) is set before each pass."""

    def __init__(self, net: CausalConditionalDecoder, budget: CacheBudget) -> None:
        self.net = net
        self.cache = LayerCache(budget)
        self.span = Span(0, 0, 0)
        self._mask: KeyLimits | None = None  # the span's chunk mask, made once per pass

    def fork(self, budget: CacheBudget) -> EstimatorStream:
        """Another request's step going on from this one's kept positions."""
        copy = EstimatorStream(self.net, budget)
        copy.cache = self.cache.fork(budget)
        return copy

    def __call__(  # noqa: PLR0917 - called as the estimator is (`ConditionalFlowMatching.solve`)
        self,
        x: Tensor,
        mask: Tensor,
        mu: Tensor,
        t: Tensor,
        spks: Tensor,
        cond: Tensor,
        *,
        streaming: bool = True,
    ) -> Tensor:
        """x, mu, cond (B, 80, n) for the span's frames; t (B,); spks (B, 80) -> (B, 80, n).

        `mask` must be all ones (one request, no padding) and `streaming` true: what the
        incremental pass computes is the chunk-masked estimator."""
        if not streaming or x.size(-1) != self.span.length:
            raise ValueError(f"estimator stream: {x.size(-1)} frames for span {self.span}")
        net = self.net
        self._mask = key_limits(self.span, net.config.static_chunk_size)
        time_emb = net.time_mlp(timestep_embedding(t, net.config.in_channels))
        spks = spks.unsqueeze(-1).expand(-1, -1, x.size(-1))
        h = torch.cat([x, mu, spks, cond], dim=1)  # (B, 320, n)
        down, up = cast(UNetStage, net.down_blocks[0]), cast(UNetStage, net.up_blocks[0])
        skip = self._stage(down, h, time_emb)
        h = self.cache.conv(cast(nn.Conv1d, down[2]), skip, self.span.keep)
        for mid in net.mid_blocks:
            h = self._stage(cast(UNetStage, mid), h, time_emb)
        h = self._stage(up, torch.cat([h, skip], dim=1), time_emb)
        h = self.cache.conv(cast(nn.Conv1d, up[2]), h, self.span.keep)
        h = self._block(net.final_block, h)
        return net.final_proj(h)

    def _stage(self, stage: UNetStage, x: Tensor, time_emb: Tensor) -> Tensor:
        """(B, C_in, n) -> (B, C, n): the resnet, then the transformer blocks (time-major)."""
        h = self._resnet(cast(CausalResnetBlock1D, stage[0]), x, time_emb).transpose(1, 2)
        for block in cast(nn.ModuleList, stage[1]):
            h = self._transformer(cast(TransformerBlock, block), h)
        return h.transpose(1, 2)

    def _block(self, block: CausalBlock1D, x: Tensor) -> Tensor:
        conv = cast(nn.Conv1d, block.block["0"])
        h = block.block["2"](self.cache.conv(conv, x, self.span.keep))
        return F.mish(h)

    def _resnet(self, resnet: CausalResnetBlock1D, x: Tensor, time_emb: Tensor) -> Tensor:
        h = self._block(resnet.block1, x) + resnet.mlp(time_emb).unsqueeze(-1)
        return self._block(resnet.block2, h) + resnet.res_conv(x)

    def _transformer(self, block: TransformerBlock, x: Tensor) -> Tensor:
        """x (B, n, dim) -> (B, n, dim)."""
        x = x + self._attention(block.attn1, block.norm1(x))
        return x + block.ff(block.norm3(x))

    def _attention(self, layer: SelfAttention, x: Tensor) -> Tensor:
        """New queries against the kept and the new keys, chunk-masked: (B, n, dim)."""
        batch = x.size(0)

        def split(h: Tensor) -> Tensor:  # (B, n, H*hd) -> (B, H, n, hd)
            return h.view(batch, -1, layer.heads, h.size(-1) // layer.heads).transpose(1, 2)

        q, k, v = (split(h) for h in layer.project(x))
        segments = self.cache.key_value_segments(layer, k, v, self.span.keep)
        out = attention_over(  # (B, H, n, hd)
            q,
            segments,
            self._mask,
            score_block_bytes=layer.score_block_bytes,
            blocked=layer.blocked_attention,
        )
        return layer.to_out[0](out.transpose(1, 2).flatten(2))
