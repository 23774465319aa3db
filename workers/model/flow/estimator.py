"""The flow's velocity estimator: CosyVoice 2's causal U-Net (`CausalConditionalDecoder`).

One U-Net level: a down block (causal resnet, transformer blocks, causal conv), `num_mid_blocks`
mid blocks (resnet + transformers), an up block that takes the down block's output as a skip
connection, then a final causal block and a 1x1 projection to mel bins. The time step enters
through a sinusoidal embedding and an MLP added inside every resnet. Convolutions only look
back in time; attention is full, or limited to static chunks when streaming.

Written for Core ML conversion later: attention is `scaled_dot_product_attention` with a
boolean mask (upstream adds a -1e10 bias, which becomes -inf in fp16; a boolean mask gives the
same probabilities in fp32), and nothing in a traced `forward` depends on tensor values. On CPU
outside tracing, attention runs as `cpu_attention.attention` (the same function, faster there).
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workers.model.cpu_attention import AttentionLayer
from workers.model.cpu_conv import Conv1d
from workers.model.cpu_linear import Linear
from workers.model.flow.config import EstimatorConfig
from workers.model.flow.encoder import chunk_mask

TIME_SCALE = 1000.0  # the flow time t in [0, 1] is scaled before the sinusoidal embedding


def timestep_embedding(t: Tensor, dim: int) -> Tensor:
    """t (B,) -> (B, dim): [sin | cos] of 1000*t at log(10000)/(dim/2 - 1)-spaced frequencies."""
    half = dim // 2
    step = math.log(10000) / (half - 1)
    freqs = torch.exp(torch.arange(half, device=t.device).float() * -step)
    angles = TIME_SCALE * t.unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat((angles.sin(), angles.cos()), dim=-1).to(t.dtype)


class TimestepMLP(nn.Module):
    """Linear, SiLU, Linear on the sinusoidal time embedding."""

    def __init__(self, in_dim: int, out_dim: int) -> None:
        super().__init__()
        self.linear_1 = Linear(in_dim, out_dim)
        self.linear_2 = Linear(out_dim, out_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


class CausalConv1d(Conv1d):
    """Conv1d (stride 1) left-padded by kernel-1 zeros: output t sees inputs <= t."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__(in_channels, out_channels, kernel_size)
        self.causal_padding = kernel_size - 1

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C_in, T) -> (B, C_out, T)."""
        return super().forward(F.pad(x, (self.causal_padding, 0)))


class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channel axis of a (B, C, T) tensor."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(x.transpose(1, 2)).transpose(1, 2)


class CausalBlock1D(nn.Module):
    """Causal conv k3, LayerNorm over channels, Mish; input and output masked.

    Keys are `block.0` (conv) and `block.2` (norm): upstream keeps transposes at 1 and 3.
    """

    def __init__(self, dim: int, dim_out: int, eps: float) -> None:
        super().__init__()
        self.block = nn.ModuleDict(
            {"0": CausalConv1d(dim, dim_out, 3), "2": ChannelLayerNorm(dim_out, eps=eps)}
        )

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, C_in, T), mask (B, 1, T) -> (B, C_out, T)."""
        h = self.block["2"](self.block["0"](x * mask))
        return F.mish(h) * mask


class CausalResnetBlock1D(nn.Module):
    """Two causal blocks with the time embedding added between them, plus a 1x1 residual."""

    def __init__(self, dim: int, dim_out: int, time_dim: int, eps: float) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), Linear(time_dim, dim_out))
        self.block1 = CausalBlock1D(dim, dim_out, eps)
        self.block2 = CausalBlock1D(dim_out, dim_out, eps)
        self.res_conv = Conv1d(dim, dim_out, 1)

    def forward(self, x: Tensor, mask: Tensor, time_emb: Tensor) -> Tensor:
        """x (B, C_in, T), mask (B, 1, T), time_emb (B, time_dim) -> (B, C_out, T)."""
        h = self.block1(x, mask) + self.mlp(time_emb).unsqueeze(-1)
        return self.block2(h, mask) + self.res_conv(x * mask)


class SelfAttention(AttentionLayer):
    """diffusers-style attention: bias-free q/k/v, `to_out.0` projection with bias."""

    def __init__(self, dim: int, heads: int, head_dim: int, score_block_mb: int = 64) -> None:
        super().__init__(score_block_mb)
        inner = heads * head_dim
        self.heads = heads
        self.to_q = Linear(dim, inner, bias=False)
        self.to_k = Linear(dim, inner, bias=False)
        self.to_v = Linear(dim, inner, bias=False)
        self.to_out = nn.ModuleList([Linear(inner, dim)])
        self.qkv: nn.Module | None = None  # q|k|v as one product (`int8_products`)

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, T, dim) -> q, k, v, each (B, T, heads * head_dim)."""
        if self.qkv is None:
            return self.to_q(x), self.to_k(x), self.to_v(x)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return q, k, v

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, T, dim), mask bool broadcastable to (B, H, T, T) -> (B, T, dim)."""
        batch = x.size(0)

        def split(h: Tensor) -> Tensor:
            return h.view(batch, -1, self.heads, h.size(-1) // self.heads).transpose(1, 2)

        q, k, v = (split(h) for h in self.project(x))
        out = self.attend(q, k, v, mask)  # (B, H, T, hd)
        return self.to_out[0](out.transpose(1, 2).flatten(2))


class GeluProjection(nn.Module):
    """diffusers `GELU`: Linear then exact (erf) GELU; the key is `proj`."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.proj = Linear(dim, hidden)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.proj(x))


class FeedForward(nn.Module):
    """`net.0` GELU projection to ff_mult*dim, `net.2` back to dim (net.1 is a no-op dropout)."""

    def __init__(self, dim: int, mult: int) -> None:
        super().__init__()
        self.net = nn.ModuleDict(
            {"0": GeluProjection(dim, mult * dim), "2": Linear(mult * dim, dim)}
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net["2"](self.net["0"](x))


class TransformerBlock(nn.Module):
    """Pre-norm self-attention and feed-forward (Matcha's BasicTransformerBlock, no cross-attn)."""

    def __init__(self, config: EstimatorConfig) -> None:
        super().__init__()
        dim, eps = config.channels, config.layer_norm_eps
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn1 = SelfAttention(
            dim, config.num_heads, config.attention_head_dim, config.attention_score_block_mb
        )
        self.norm3 = nn.LayerNorm(dim, eps=eps)
        self.ff = FeedForward(dim, config.ff_mult)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """x (B, T, dim) -> (B, T, dim)."""
        x = x + self.attn1(self.norm1(x), mask)
        return x + self.ff(self.norm3(x))


class UNetStage(nn.ModuleList):
    """[0] resnet, [1] transformer blocks, [2] optional causal conv k3: indices are the keys."""

    def __init__(self, config: EstimatorConfig, dim_in: int, *, with_conv: bool) -> None:
        ch = config.channels
        layers: list[nn.Module] = [
            CausalResnetBlock1D(dim_in, ch, config.time_embed_dim, config.layer_norm_eps),
            nn.ModuleList(TransformerBlock(config) for _ in range(config.n_blocks)),
        ]
        if with_conv:
            layers.append(CausalConv1d(ch, ch, 3))
        super().__init__(layers)

    def forward(self, x: Tensor, mask: Tensor, time_emb: Tensor, attn_mask: Tensor) -> Tensor:
        """x (B, C_in, T) -> (B, C, T): resnet, then the transformer blocks (time-major)."""
        h = self[0](x, mask, time_emb).transpose(1, 2)
        for block in cast(nn.ModuleList, self[1]):
            h = block(h, attn_mask)
        return h.transpose(1, 2)

    def conv(self, x: Tensor, mask: Tensor) -> Tensor:
        """The stage's causal conv on the masked input (down/up sampling stand-in, stride 1)."""
        return self[2](x * mask)


class CausalConditionalDecoder(nn.Module):
    """The U-Net estimator: velocity (B, 80, T) from x, mu, t, speaker and prompt condition."""

    def __init__(self, config: EstimatorConfig) -> None:
        super().__init__()
        self.config = config
        ch, eps = config.channels, config.layer_norm_eps
        self.time_mlp = TimestepMLP(config.in_channels, config.time_embed_dim)
        self.down_blocks = nn.ModuleList([UNetStage(config, config.in_channels, with_conv=True)])
        self.mid_blocks = nn.ModuleList(
            UNetStage(config, ch, with_conv=False) for _ in range(config.num_mid_blocks)
        )
        self.up_blocks = nn.ModuleList([UNetStage(config, 2 * ch, with_conv=True)])
        self.final_block = CausalBlock1D(ch, ch, eps)
        self.final_proj = Conv1d(ch, config.out_channels, 1)

    def attention_mask(self, mask: Tensor, streaming: bool) -> Tensor:
        """mask (B, 1, T) float -> bool (B, 1, 1|T, T): padded keys off, chunks when streaming."""
        keys = mask.bool().unsqueeze(1)  # (B, 1, 1, T)
        if streaming and self.config.static_chunk_size > 0:
            chunks = chunk_mask(mask.size(-1), self.config.static_chunk_size, device=mask.device)
            keys = keys & chunks  # (B, 1, T, T)
        return keys

    def forward(  # noqa: PLR0917 - upstream's estimator interface, also the Core ML inputs
        self,
        x: Tensor,
        mask: Tensor,
        mu: Tensor,
        t: Tensor,
        spks: Tensor,
        cond: Tensor,
        *,
        streaming: bool = False,
    ) -> Tensor:
        """x, mu, cond (B, 80, T); mask (B, 1, T); t (B,); spks (B, 80) -> velocity (B, 80, T)."""
        time_emb = self.time_mlp(timestep_embedding(t, self.config.in_channels))
        spks = spks.unsqueeze(-1).expand(-1, -1, x.size(-1))
        h = torch.cat([x, mu, spks, cond], dim=1)  # (B, 320, T)
        attn_mask = self.attention_mask(mask, streaming)

        down, up = cast(UNetStage, self.down_blocks[0]), cast(UNetStage, self.up_blocks[0])
        skip = down(h, mask, time_emb, attn_mask)
        h = down.conv(skip, mask)
        for mid in self.mid_blocks:
            h = mid(h, mask, time_emb, attn_mask)
        h = up(torch.cat([h, skip], dim=1), mask, time_emb, attn_mask)
        h = up.conv(h, mask)
        h = self.final_block(h, mask)
        return self.final_proj(h * mask) * mask
