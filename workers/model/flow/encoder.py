"""The flow stage's token encoder: CosyVoice 2's `UpsampleConformerEncoder`, written from scratch.

25 Hz token embeddings go through a linear embed (Linear, LayerNorm, x sqrt(width)), a
pre-look-ahead conv block that lets each token see the next `pre_lookahead_len` tokens, pre-norm
conformer blocks with ESPnet relative-position self-attention (no macaron feed-forward, no conv
module), a nearest x2 upsample with a causal conv, a second linear embed, 4 more conformer blocks
and a final LayerNorm. The relative-position table is computed on use, so it is not in the state
dict and the module builds on the meta device. Attention is full (non-streaming) or restricted
to static chunks counted from the start of the sequence (streaming).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workers.model.cpu_linear import Linear
from workers.model.flow.config import FlowEncoderConfig


def relative_positions(length: int, width: int, *, like: Tensor) -> Tensor:
    """ESPnet `rel_pos_espnet` embedding rows for relative positions length-1 down to -(length-1).

    Returns (1, 2*length-1, width) with sin at even and cos at odd channels, the same values
    upstream's 5000-row table holds (each entry depends only on its own position).
    """
    return relative_rows(length - 1, -(length - 1), width, like=like)


def relative_rows(high: int, low: int, width: int, *, like: Tensor) -> Tensor:
    """(1, high-low+1, width): the `relative_positions` rows for positions high down to low."""
    position = torch.arange(high, low - 1, -1, device=like.device, dtype=torch.float32)
    inv_freq = torch.exp(
        torch.arange(0, width, 2, device=like.device, dtype=torch.float32)
        * -(math.log(10000.0) / width)
    )
    angles = position.unsqueeze(1) * inv_freq  # (rows, width/2)
    table = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)  # interleave sin, cos
    return table.unsqueeze(0).to(like.dtype)


def chunk_mask(length: int, chunk: int, *, device: torch.device) -> Tensor:
    """(length, length) bool: query i sees the keys before (i // chunk + 1) * chunk."""
    index = torch.arange(length, device=device)
    chunk_end = (torch.div(index, chunk, rounding_mode="floor") + 1) * chunk
    return index.unsqueeze(0) < chunk_end.unsqueeze(1)


def _shift_relative(scores: Tensor) -> Tensor:
    """(B, H, T, 2T-1) scores against relative positions -> (B, H, T, T) scores per key.

    Column j of the input is relative position T-1-j; output [i, k] must be position i-k, i.e.
    input column T-1-i+k. Padding one zero column and re-viewing the buffer shifts row i left
    by i (Transformer-XL's trick), which traces and converts without gather or as_strided.
    """
    batch, heads, time, positions = scores.shape
    padded = F.pad(scores, (1, 0)).view(batch, heads, positions + 1, time)
    return padded[:, :, 1:].reshape(batch, heads, time, positions)[..., :time]


class RelPositionSelfAttention(nn.Module):
    """Multi-head self-attention with Transformer-XL relative positions (pos_bias_u/v)."""

    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = width // heads
        # Registration order follows upstream so state_dict() lists keys in file order.
        self.linear_q = Linear(width, width)
        self.linear_k = Linear(width, width)
        self.linear_v = Linear(width, width)
        self.linear_out = Linear(width, width)
        self.linear_pos = Linear(width, width, bias=False)
        self.pos_bias_u = nn.Parameter(torch.empty(heads, self.head_dim))
        self.pos_bias_v = nn.Parameter(torch.empty(heads, self.head_dim))
        nn.init.xavier_uniform_(self.pos_bias_u)  # upstream's init (random-weight models)
        nn.init.xavier_uniform_(self.pos_bias_v)

    def _heads(self, x: Tensor) -> Tensor:
        return x.view(x.size(0), -1, self.heads, self.head_dim)  # (B, T, H, dk)

    def forward(self, x: Tensor, pos: Tensor, mask: Tensor | None) -> Tensor:
        """x (B, T, D), pos (1, 2T-1, D), mask bool broadcastable to (B, H, T, T) or None."""
        q = self._heads(self.linear_q(x))
        k = self._heads(self.linear_k(x)).transpose(1, 2)  # (B, H, T, dk)
        v = self._heads(self.linear_v(x)).transpose(1, 2)
        p = self._heads(self.linear_pos(pos)).transpose(1, 2)  # (1, H, 2T-1, dk)
        content = torch.matmul((q + self.pos_bias_u).transpose(1, 2), k.transpose(-2, -1))
        position = torch.matmul((q + self.pos_bias_v).transpose(1, 2), p.transpose(-2, -1))
        scores = (content + _shift_relative(position)) / math.sqrt(self.head_dim)
        if mask is not None:  # every query keeps >= 1 key, so a finite fill equals -inf here
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        context = torch.matmul(torch.softmax(scores, dim=-1), v)  # (B, H, T, dk)
        return self.linear_out(context.transpose(1, 2).flatten(2))


class FeedForward(nn.Module):
    """Position-wise feed-forward with swish (SiLU)."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.w_1 = Linear(width, hidden)
        self.w_2 = Linear(hidden, width)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(F.silu(self.w_1(x)))


class ConformerBlock(nn.Module):
    """Pre-norm block: x + attention(norm_mha(x)), then x + feed_forward(norm_ff(x))."""

    def __init__(self, config: FlowEncoderConfig) -> None:
        super().__init__()
        self.self_attn = RelPositionSelfAttention(config.width, config.attention_heads)
        self.feed_forward = FeedForward(config.width, config.linear_units)
        self.norm_ff = nn.LayerNorm(config.width, eps=config.layer_norm_eps)
        self.norm_mha = nn.LayerNorm(config.width, eps=config.layer_norm_eps)

    def forward(self, x: Tensor, pos: Tensor, mask: Tensor | None) -> Tensor:
        """x (B, T, D) -> (B, T, D)."""
        x = x + self.self_attn(self.norm_mha(x), pos, mask)
        return x + self.feed_forward(self.norm_ff(x))


class LinearEmbed(nn.Module):
    """Linear + LayerNorm, scaled by sqrt(width) as ESPnet's positional-encoding layer does."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.out = nn.Sequential(Linear(width, width), nn.LayerNorm(width, eps=eps))
        self.scale = math.sqrt(width)

    def forward(self, x: Tensor) -> Tensor:
        return self.out(x) * self.scale


class PreLookahead(nn.Module):
    """Residual conv pair: conv1 sees `lookahead` future tokens, conv2 (k3) is causal.

    `channels` is the width between the convs (CosyVoice 3: 80 -> 1024 -> 80); by default the
    input width (CosyVoice 2)."""

    def __init__(self, width: int, lookahead: int, *, channels: int | None = None) -> None:
        super().__init__()
        inner = width if channels is None else channels
        self.lookahead = lookahead
        self.conv1 = nn.Conv1d(width, inner, kernel_size=lookahead + 1)
        self.conv2 = nn.Conv1d(inner, width, kernel_size=3)

    def look_ahead(self, x: Tensor, context: Tensor | None) -> Tensor:
        """conv1 over x and its look-ahead: x (B, T, D), context (B, <=lookahead, D), zeros
        for the rest -> (B, D, T) channels-first, activated."""
        h = x.transpose(1, 2)
        missing = self.lookahead
        if context is not None:
            h = torch.cat([h, context.transpose(1, 2)], dim=2)
            missing -= context.size(1)
        return F.leaky_relu(self.conv1(F.pad(h, (0, missing))), negative_slope=0.01)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """x (B, T, D); context (B, <=lookahead, D) are the true next tokens -> (B, T, D).

        Without context the look-ahead sees zeros past the end (the final chunk).
        """
        h = self.look_ahead(x, context)
        h = self.conv2(F.pad(h, (self.conv2.kernel_size[0] - 1, 0)))
        return h.transpose(1, 2) + x


class Upsample(nn.Module):
    """Nearest x stride in time, left pad 2*stride, conv kernel 2*stride+1 (causal)."""

    def __init__(self, width: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(width, width, kernel_size=2 * stride + 1)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, D, T) -> (B, D, stride*T)."""
        x = F.interpolate(x, scale_factor=float(self.stride), mode="nearest")
        return self.conv(F.pad(x, (2 * self.stride, 0)))


class UpsampleConformerEncoder(nn.Module):
    """Token embeddings (B, T, D) at 25 Hz -> encoder states (B, stride*T, D) at 50 Hz."""

    def __init__(self, config: FlowEncoderConfig) -> None:
        super().__init__()
        self.config = config
        width, eps = config.width, config.layer_norm_eps
        self.embed = LinearEmbed(width, eps)
        self.after_norm = nn.LayerNorm(width, eps=eps)
        self.pre_lookahead_layer = PreLookahead(width, config.pre_lookahead_len)
        self.encoders = nn.ModuleList(ConformerBlock(config) for _ in range(config.num_blocks))
        self.up_layer = Upsample(width, config.upsample_stride)
        self.up_embed = LinearEmbed(width, eps)
        self.up_encoders = nn.ModuleList(
            ConformerBlock(config) for _ in range(config.num_up_blocks)
        )

    def _mask(
        self, x: Tensor, chunk: int, streaming: bool, valid: Tensor | None = None
    ) -> Tensor | None:
        """None (full attention), (T, T) chunks, or with `valid` (B, T) keys (B, 1, 1|T, T)."""
        mask = None
        if streaming and chunk > 0:
            mask = chunk_mask(x.size(1), chunk, device=x.device)
        if valid is None:
            return mask
        keys = valid[:, None, None, :]  # padded keys off: each row sees only its own frames
        return keys if mask is None else keys & mask

    def forward(
        self,
        x: Tensor,
        context: Tensor | None = None,
        streaming: bool = False,
        lengths: Tensor | None = None,
    ) -> Tensor:
        """x (B, T, D) token embeddings; context (B, L, D) look-ahead tokens -> (B, stride*T, D).

        `context` are tokens after the last one that only feed the look-ahead conv (a streamed
        chunk that is not final); they produce no output frames. `lengths` (B,) makes a padded
        batch: row b's first lengths[b] tokens are real, and each row's frames come out as they
        would alone (zeros past its end for the look-ahead, padded keys masked in attention).
        """
        cfg = self.config
        x = self.embed(x)
        valid = None
        if lengths is not None:
            valid = torch.arange(x.size(1), device=x.device)[None, :] < lengths[:, None]
            x = x * valid.unsqueeze(-1).to(x.dtype)
        if context is not None:
            context = self.embed(context)
        x = self.pre_lookahead_layer(x, context)
        pos = relative_positions(x.size(1), cfg.width, like=x)
        mask = self._mask(x, cfg.static_chunk_size, streaming, valid)
        for block in self.encoders:
            x = block(x, pos, mask)
        x = self.up_layer(x.transpose(1, 2)).transpose(1, 2)
        x = self.up_embed(x)
        pos = relative_positions(x.size(1), cfg.width, like=x)
        if valid is not None:
            valid = valid.repeat_interleave(cfg.upsample_stride, dim=1)
        mask = self._mask(x, cfg.static_chunk_size * cfg.upsample_stride, streaming, valid)
        for block in self.up_encoders:
            x = block(x, pos, mask)
        return self.after_norm(x)
