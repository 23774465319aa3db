"""The flow's conformer encoder over a streamed pass's new tokens (`EncoderStream`).

The same arithmetic as `UpsampleConformerEncoder.forward(streaming=True)` for one request,
position by position:
- the linear embeds, feed-forwards and norms are per position;
- the pre-look-ahead conv1 reads the token and the next `pre_lookahead_len` ones (the pass's
  look-ahead context, or zeros after the last token of the final pass); its causal conv2 reads
  the kept conv1 outputs before the pass;
- the upsampling (nearest x stride, causal conv k 2*stride+1) reads the kept last 2*stride
  upsampled frames;
- relative-position attention: the new queries against the kept and the new keys, under the
  static chunk mask; the position term takes the embedding rows of every relative position
  those pairs have (query - key, from end-1 down to start-end+1), each row depending only on
  its position, exactly as in the whole-sequence table.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from workers.model.flow.encoder import (
    ConformerBlock,
    PreLookahead,
    RelPositionSelfAttention,
    Upsample,
    UpsampleConformerEncoder,
    relative_rows,
)
from workers.model.flow.stream_layers import CacheBudget, LayerCache, Span, visible_keys


@dataclass(frozen=True)
class _Layout:
    """What every attention layer of one rate shares in a pass: the span, its chunk mask
    (n, end) and the relative-position rows (1, n+end-1, D) its query-key pairs have."""

    span: Span
    mask: Tensor | None
    rows: Tensor

    @classmethod
    def of(cls, span: Span, chunk: int, *, like: Tensor) -> _Layout:
        rows = relative_rows(span.end - 1, span.start - span.end + 1, like.size(-1), like=like)
        return cls(span, visible_keys(span, chunk, device=like.device), rows)


class EncoderStream:
    """The encoder with one piece's cache: each call computes one pass's new positions."""

    def __init__(self, net: UpsampleConformerEncoder, budget: CacheBudget) -> None:
        self.net = net
        self.cache = LayerCache(budget)

    def fork(self, budget: CacheBudget) -> EncoderStream:
        """Another request's stream going on from this one's kept positions."""
        copy = EncoderStream(self.net, budget)
        copy.cache = self.cache.fork(budget)
        return copy

    def __call__(self, x: Tensor, context: Tensor | None, span: Span) -> Tensor:
        """Token embeddings x (1, n, D) of the span's tokens, context (1, L, D) the look-ahead
        tokens after them (None on the final pass) -> encoder states (1, stride*n, D)."""
        cfg = self.net.config
        x = self.net.embed(x)
        if context is not None:
            context = self.net.embed(context)
        x = self._pre_lookahead(self.net.pre_lookahead_layer, x, context, span.keep)
        layout = _Layout.of(span, cfg.static_chunk_size, like=x)
        for block in self.net.encoders:
            x = self._block(cast(ConformerBlock, block), x, layout)
        frames = span.scaled(cfg.upsample_stride)
        x = self._upsample(self.net.up_layer, x, frames.keep)
        x = self.net.up_embed(x)
        layout = _Layout.of(frames, cfg.static_chunk_size * cfg.upsample_stride, like=x)
        for block in self.net.up_encoders:
            x = self._block(cast(ConformerBlock, block), x, layout)
        return self.net.after_norm(x)

    def _pre_lookahead(
        self, layer: PreLookahead, x: Tensor, context: Tensor | None, keep: int
    ) -> Tensor:
        """x (1, n, D), context (1, L, D) -> (1, n, D)."""
        h = self.cache.conv(layer.conv2, layer.look_ahead(x, context), keep)
        return h.transpose(1, 2) + x

    def _upsample(self, layer: Upsample, x: Tensor, keep: int) -> Tensor:
        """x (1, n, D) -> (1, stride*n, D)."""
        h = F.interpolate(x.transpose(1, 2), scale_factor=float(layer.stride), mode="nearest")
        return self.cache.conv(layer.conv, h, keep).transpose(1, 2)

    def _block(self, block: ConformerBlock, x: Tensor, layout: _Layout) -> Tensor:
        """x (1, n, D) -> (1, n, D)."""
        x = x + self._attention(block.self_attn, block.norm_mha(x), layout)
        return x + block.feed_forward(block.norm_ff(x))

    def _attention(self, attention: RelPositionSelfAttention, x: Tensor, layout: _Layout) -> Tensor:
        """Relative-position attention of the new queries x (1, n, D) -> (1, n, D)."""
        span = layout.span
        q = attention._heads(attention.linear_q(x))  # (1, n, H, dk)
        k = attention._heads(attention.linear_k(x)).transpose(1, 2)  # (1, H, n, dk)
        v = attention._heads(attention.linear_v(x)).transpose(1, 2)
        keys, values = self.cache.keys_values(attention, k, v, span.keep)  # (1, H, end, dk)
        p = attention._heads(attention.linear_pos(layout.rows)).transpose(1, 2)  # (1,H,n+end-1,dk)
        content = torch.matmul((q + attention.pos_bias_u).transpose(1, 2), keys.transpose(-2, -1))
        position = torch.matmul((q + attention.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))
        scores = (content + _per_key(position, span)) / math.sqrt(attention.head_dim)
        if layout.mask is not None:  # every query keeps >= 1 key: a finite fill equals -inf
            scores = scores.masked_fill(~layout.mask, torch.finfo(scores.dtype).min)
        out = torch.matmul(torch.softmax(scores, dim=-1), values)  # (1, H, n, dk)
        return attention.linear_out(out.transpose(1, 2).flatten(2))


def _per_key(position: Tensor, span: Span) -> Tensor:
    """(B, H, n, n+end-1) scores against relative positions end-1 .. start-end+1 -> (B, H, n,
    end) per key: query start+a and key j have relative position start+a-j, i.e. column
    n-1-a+j."""
    batch, heads, n, _ = position.shape
    query = torch.arange(n, device=position.device).unsqueeze(1)
    key = torch.arange(span.end, device=position.device).unsqueeze(0)
    index = (n - 1 - query + key).expand(batch, heads, n, span.end)
    return position.gather(-1, index)
