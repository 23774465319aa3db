"""CosyVoice 3's velocity estimator: the DiT (adaLN-Zero transformer over mel frames).

Inputs are channel-major like CosyVoice 2's U-Net (x, mu, cond (B, 80, T), spks (B, 80), t (B,),
mask (B, 1, T)) and the call signature is the same, so one flow-matching solver drives both.
Inside, frames are time-major: [x, cond, mu, spks] -> Linear -> + causal grouped-conv position
term; `depth` blocks of (adaLN-Zero modulated) self-attention and GELU-tanh feed-forward, each
scaled by a time-dependent gate; a final modulated LayerNorm and a projection back to 80 bins.
Rotary positions (interleaved pairs, base 10000) are applied to the first `dim_head` channels
of the concatenated q and k only: head 0, as upstream (x-transformers' partial rotary).
Attention is full, or limited to static chunks of `static_chunk_size` frames when streaming.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workers.model.cpu_attention import AttentionLayer
from workers.model.cpu_conv import Conv1d
from workers.model.cpu_linear import (
    Linear,
    concatenated_linear,
    cpu_inference,
    fusable,
    linear_gelu,
)
from workers.model.dit.config import DiTConfig
from workers.model.dit.modulation import ModulationMemo
from workers.model.flow.encoder import chunk_mask
from workers.model.flow.estimator import timestep_embedding


class TimestepEmbedding(nn.Module):
    """t (B,) -> (B, dim): sinusoidal features of 1000 t, then Linear, SiLU, Linear."""

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.freq_dim = config.time_freq_dim
        self.time_mlp = nn.Sequential(
            Linear(config.time_freq_dim, config.dim), nn.SiLU(), Linear(config.dim, config.dim)
        )

    def forward(self, t: Tensor) -> Tensor:
        return self.time_mlp(timestep_embedding(t, self.freq_dim))


class CausalConvPositionEmbedding(nn.Module):
    """(B, T, D) -> (B, T, D): two grouped convs, each left-padded (causal) and Mish-activated
    (`cpu_conv.Conv1d`: packed where the kernel policy packs the flow's bf16 convs)."""

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        dim, kernel, groups = config.dim, config.conv_pos_kernel, config.conv_pos_groups
        self.pad = kernel - 1
        self.conv1 = nn.Sequential(Conv1d(dim, dim, kernel, groups=groups), nn.Mish())
        self.conv2 = nn.Sequential(Conv1d(dim, dim, kernel, groups=groups), nn.Mish())

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.pad(x.transpose(1, 2), (self.pad, 0)))
        h = self.conv2(F.pad(h, (self.pad, 0)))
        return h.transpose(1, 2)


class InputEmbedding(nn.Module):
    """x, cond, mu (B, T, 80) and spks (B, 80) -> (B, T, dim), position term added."""

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.proj = Linear(config.in_channels, config.dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(config)

    def forward(self, x: Tensor, cond: Tensor, mu: Tensor, spks: Tensor) -> Tensor:
        spks = spks.unsqueeze(1).expand(-1, x.size(1), -1)
        h = self.proj(torch.cat([x, cond, mu, spks], dim=-1))
        return self.conv_pos_embed(h) + h


class RotaryEmbedding(nn.Module):
    """Rotary angles per position; `inv_freq` is a persistent buffer (it is in flow.pt)."""

    inv_freq: Tensor

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.register_buffer("inv_freq", rotary_inv_freq(config))

    def forward(self, length: int) -> Tensor:
        """(T, dim_head): angle position * inv_freq[i] on channels 2i and 2i+1."""
        positions = torch.arange(length, device=self.inv_freq.device, dtype=self.inv_freq.dtype)
        angles = positions.unsqueeze(1) * self.inv_freq.unsqueeze(0)
        return angles.repeat_interleave(2, dim=-1)


def rotary_inv_freq(config: DiTConfig) -> Tensor:
    """1 / base^(2i/dim_head), i = 0..dim_head/2-1 (float32), as x-transformers computes it."""
    exponents = torch.arange(0, config.dim_head, 2).float() / config.dim_head
    return 1.0 / (config.rotary_base**exponents)


def apply_rotary(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate the first angles.size(-1) channels of x (B, T, C) in interleaved pairs."""
    return rotate(x, angles.cos(), angles.sin())


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """`apply_rotary` with the angles' cosines and sines given (made once per estimator call)."""
    width = cos.size(-1)
    return torch.cat((rotated_head(x[..., :width], cos, sin), x[..., width:]), dim=-1)


def rotated_head(head: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The rotary channels (B, T, width) turned: pairs (a, b) -> (a cos - b sin, b cos + a sin)."""
    pairs = head.unflatten(-1, (-1, 2))
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return head * cos + rotated * sin


@dataclass(frozen=True)
class Frames:
    """One estimator call's attention inputs, shared by its blocks."""

    mask: Tensor | None  # (B, 1, T, T) bool, True = may attend; None: everywhere
    keep: Tensor | None  # (B, T, 1): frames the last query sees (1) or not (0); None: all
    cos: Tensor  # (T, dim_head) rotary angles' cosines and sines
    sin: Tensor


class Attention(AttentionLayer):
    """Multi-head self-attention with biased projections and rotary positions on head 0.

    `qkv_proj` is set by `fuse_dit_projections` (CPU bf16): q/k/v as one product, the three
    layers left empty. Attention runs through `cpu_attention` (blocked bf16 on CPU)."""

    def __init__(self, config: DiTConfig) -> None:
        super().__init__(config.attention_score_block_mb)
        self.heads = config.heads
        self.to_q = Linear(config.dim, config.inner_dim)
        self.to_k = Linear(config.dim, config.inner_dim)
        self.to_v = Linear(config.dim, config.inner_dim)
        self.to_out = nn.ModuleList([Linear(config.inner_dim, config.dim)])
        self.qkv_proj: Linear | None = None

    def forward(self, x: Tensor, frames: Frames) -> Tensor:
        """x (B, T, D) -> (B, T, D)."""
        if self.qkv_proj is not None and cpu_inference(x, x):
            q, k, v = self._fused_heads(x, frames)
        else:
            q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
            q, k = rotate(q, frames.cos, frames.sin), rotate(k, frames.cos, frames.sin)
            q, k, v = (h.unflatten(-1, (self.heads, -1)).transpose(1, 2) for h in (q, k, v))
        out = self.attend(q, k, v, frames.mask)
        out = self.to_out[0](out.transpose(1, 2).flatten(2))
        # Upstream zeroes the frames the last query may not see (padding; never in inference).
        return out if frames.keep is None else out * frames.keep

    def _fused_heads(self, x: Tensor, frames: Frames) -> tuple[Tensor, ...]:
        """q, k, v (B, H, T, d), each contiguous, from one product: the rotary channels turned
        in place (no copy of q and k around them), then one copy into head-major order (the
        blocked attention reads each as (B*H, T, d) without copying it again)."""
        qkv = self.qkv_proj(x)  # type: ignore[misc]
        width, inner = frames.cos.size(-1), qkv.size(-1) // 3
        for start in (0, inner):  # q's and k's first channels (head 0)
            head = qkv[..., start : start + width]
            head.copy_(rotated_head(head, frames.cos, frames.sin))
        heads = qkv.unflatten(-1, (3, self.heads, -1)).permute(2, 0, 3, 1, 4).contiguous()
        return heads.unbind(0)


def fuse_dit_projections(module: nn.Module) -> int:
    """Give every DiT attention under `module` one q/k/v product where `cpu_linear.fusable`
    (CPU bf16 weights, to be packed); the count fused."""
    fused = 0
    for sub in module.modules():
        if isinstance(sub, Attention) and sub.qkv_proj is None:
            parts = [sub.to_q, sub.to_k, sub.to_v]
            if fusable(parts):
                sub.qkv_proj = concatenated_linear(parts)
                fused += 1
    return fused


def addcmul(base: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """base + a * b: one op (one rounding in bf16) in CPU inference; the two ops elsewhere
    (tracing: Core ML's converter has no addcmul)."""
    if cpu_inference(a, a):
        return torch.addcmul(base, a, b)
    return base + a * b


class AdaLayerNorm(nn.Module):
    """LayerNorm without weights, modulated by `parts` vectors from Linear(SiLU(time))."""

    def __init__(self, config: DiTConfig, parts: int) -> None:
        super().__init__()
        self.eps = config.layer_norm_eps
        self.parts = parts
        self.linear = Linear(config.dim, config.dim * parts)

    def norm(self, x: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
        """LayerNorm(x) * (1 + scale) + shift. One modulation for every row (B = 1 in shift
        and scale, CPU inference): LayerNorm's own affine, one pass over x; else one `addcmul`
        after the norm."""
        if cpu_inference(x, x) and shift.size(0) == 1:  # (a traced size is a tensor)
            weight, bias = (1 + scale).reshape(-1), shift.reshape(-1)
            return F.layer_norm(x, x.shape[-1:], weight, bias, eps=self.eps)
        return addcmul(shift, F.layer_norm(x, x.shape[-1:], eps=self.eps), 1 + scale)


class FeedForward(nn.Module):
    """Linear, GELU (tanh approximation), Linear; keys ff.0.0 and ff.2 as upstream's."""

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        inner = config.dim * config.ff_mult
        project_in = nn.Sequential(Linear(config.dim, inner), nn.GELU(approximate="tanh"))
        self.ff = nn.Sequential(project_in, nn.Identity(), Linear(inner, config.dim))

    def forward(self, x: Tensor) -> Tensor:
        """The GELU is the first product's post-op on packed weights (`linear_gelu`)."""
        project_in = cast(nn.Sequential, self.ff[0])
        return self.ff[2](linear_gelu(cast(Linear, project_in[0]), x, approximate="tanh"))


class DiTBlock(nn.Module):
    """Pre-norm block: gated attention, then gated feed-forward, both adaLN-Zero modulated."""

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.attn_norm = AdaLayerNorm(config, parts=6)
        self.attn = Attention(config)
        self.ff = FeedForward(config)

    def forward(self, x: Tensor, modulation: Tensor, frames: Frames) -> Tensor:
        """x (B, T, D), modulation (B, 6 D) (`attn_norm.linear(SiLU(time))`) -> (B, T, D);
        each residual one `addcmul`."""
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = modulation.unsqueeze(1).chunk(6, -1)
        h = self.attn_norm.norm(x, shift_a, scale_a)
        x = addcmul(x, gate_a, self.attn(h, frames))
        h = self.attn_norm.norm(x, shift_f, scale_f)
        return addcmul(x, gate_f, self.ff(h))


class FinalNorm(AdaLayerNorm):
    """The output modulation: scale first, then shift (the reverse of the blocks' order)."""

    def __init__(self, config: DiTConfig) -> None:
        super().__init__(config, parts=2)

    def forward(self, x: Tensor, modulation: Tensor) -> Tensor:
        """x (B, T, D), modulation (B, 2 D) (`linear(SiLU(time))`) -> (B, T, D)."""
        scale, shift = modulation.unsqueeze(1).chunk(2, dim=-1)
        return self.norm(x, shift, scale)


class DiT(nn.Module):
    """The estimator; attribute names match the official checkpoint's `decoder.estimator.*`."""

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.config = config
        self.time_embed = TimestepEmbedding(config)
        self.input_embed = InputEmbedding(config)
        self.rotary_embed = RotaryEmbedding(config)
        self.transformer_blocks = nn.ModuleList(DiTBlock(config) for _ in range(config.depth))
        self.norm_out = FinalNorm(config)
        self.proj_out = Linear(config.dim, config.mel_dim)
        self.modulation_memo = ModulationMemo(config.time_cache_values)
        self.register_load_state_dict_pre_hook(lambda *_: self.modulation_memo.clear())

    def _apply(self, fn: Callable[..., Tensor], recurse: bool = True) -> DiT:
        self.modulation_memo.clear()  # .to(), .float(), ...: the kept vectors are stale
        return super()._apply(fn, recurse)

    def modulations(self, t: Tensor) -> list[Tensor]:
        """t (B,) -> every block's (B, 6 D) modulation, then the output norm's (B, 2 D): kept
        per distinct t on CPU (`ModulationMemo`), computed as upstream elsewhere. On CPU,
        when every row has the same t, one row (1, ...) that the blocks broadcast."""
        norms = [cast(DiTBlock, block).attn_norm.linear for block in self.transformer_blocks]
        norms.append(self.norm_out.linear)

        def compute(times: Tensor) -> list[Tensor]:
            time_act = F.silu(self.time_embed(times))
            return [norm(time_act) for norm in norms]

        if not cpu_inference(t, t):
            return compute(t)
        params = [*self.time_embed.parameters(), *(p for n in norms for p in n.parameters())]
        found = self.modulation_memo.lookup(t, params, compute)
        if bool((t == t[0]).all()):  # one t for every row (CFG's two): one row, broadcast
            return [rows[:1] for rows in found]
        return found

    def attention_mask(self, mask: Tensor, streaming: bool) -> Tensor:
        """(B, 1, T) frame mask -> (B, 1, T, T) bool: valid keys, within the chunk if streaming."""
        keys = mask.bool()  # (B, 1, T): broadcast over queries
        length = mask.size(-1)
        if streaming:
            keys = keys & chunk_mask(length, self.config.static_chunk_size, device=mask.device)
        return keys.expand(-1, length, -1).unsqueeze(1)

    def forward(  # noqa: PLR0917 - the CFM solver's estimator interface
        self,
        x: Tensor,
        mask: Tensor,
        mu: Tensor,
        t: Tensor,
        spks: Tensor,
        cond: Tensor,
        streaming: bool = False,
    ) -> Tensor:
        """x, mu, cond (B, 80, T); mask (B, 1, T); t (B,); spks (B, 80) -> velocity (B, 80, T)."""
        *modulations, final = self.modulations(t)
        h = self.input_embed(x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2), spks)
        frames = self.frames(mask, streaming, h)
        for block, modulation in zip(self.transformer_blocks, modulations, strict=True):
            h = block(h, modulation, frames)
        return self.proj_out(self.norm_out(h, final)).transpose(1, 2)

    def frames(self, mask: Tensor, streaming: bool, h: Tensor) -> Frames:
        """What every block's attention reads, made once per call. On CPU outside tracing a
        mask that hides nothing (a lone request's pass) is dropped: no fill, no product."""
        angles = self.rotary_embed(h.size(1)).to(h.dtype)
        attn_mask = self.attention_mask(mask, streaming)
        if cpu_inference(h, h) and bool(attn_mask.all()):
            return Frames(None, None, angles.cos(), angles.sin())
        keep = attn_mask[:, 0, -1].unsqueeze(-1).to(h.dtype)
        return Frames(attn_mask, keep, angles.cos(), angles.sin())
