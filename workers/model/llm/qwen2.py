"""Our own small Qwen2 decoder (the backbone of CosyVoice 2's LLM), no transformers needed.

Same arithmetic as Hugging Face's `Qwen2Model` (RMSNorm, grouped-query attention with biased
q/k/v and unbiased o, rotate-half RoPE, SiLU-gated MLP, final norm) and the same parameter
names, so official checkpoints load strictly. Differences on purpose:
- masking is explicit: every query attends to every earlier position (the meaning upstream's
  incremental decoding relies on; see the reference README's "Incremental decoding" pitfall);
- the KV cache is a preallocated per-request object passed to `forward`, never module state;
- batch-1 CPU matmuls can run through oneDNN (`cpu_linear.Linear`), which uses both cores
  where torch's MKL gemv path uses one (measured ~2x faster
  decoding: `cosyq-worker bench`'s LLM rows).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from shared.errors import InvalidRequestError, ModelLoadError
from workers.model.cpu_linear import Linear
from workers.model.embedding import mapped_table_embedding


@dataclass(frozen=True)
class Qwen2Config:
    """Every size of the backbone; read from a Hugging Face Qwen2 `config.json`."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf_config(cls, doc: Mapping[str, Any], *, source: str) -> Qwen2Config:
        """From Hugging Face Qwen2 keys (the model directory's `CosyVoice-BlankEN/config.json`)."""

        def get(key: str) -> Any:
            if key not in doc:
                raise ModelLoadError(f"{source}: missing key {key!r} (Qwen2 config)")
            return doc[key]

        if doc.get("hidden_act", "silu") != "silu":
            raise ModelLoadError(f"{source}: hidden_act must be 'silu', got {doc['hidden_act']!r}")
        config = cls(
            hidden_size=int(get("hidden_size")),
            num_layers=int(get("num_hidden_layers")),
            num_heads=int(get("num_attention_heads")),
            num_kv_heads=int(get("num_key_value_heads")),
            intermediate_size=int(get("intermediate_size")),
            vocab_size=int(get("vocab_size")),
            rms_norm_eps=float(get("rms_norm_eps")),
            rope_theta=float(get("rope_theta")),
            max_position_embeddings=int(get("max_position_embeddings")),
        )
        config.validate(source)
        return config

    def validate(self, source: str) -> None:
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ModelLoadError(
                f"{source}: hidden_size {self.hidden_size} must divide into num_attention_heads "
                f"{self.num_heads}, which must divide into num_key_value_heads {self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ModelLoadError(f"{source}: head_dim {self.head_dim} must be even for RoPE")


# A one-query (decode) attention in bf16/fp16 on CPU reads keys in multiples of this many
# positions, the ones past the cache's length masked: oneDNN compiles its matmuls per shape and
# keeps them, so reading exactly `length` keys built two new kernels every decode step (0.2-0.36
# ms each, ~1 ms of a 20-30 ms step with their dispatch) and held ~90 MB of them after one
# request (full-random bf16, AMD EPYC Zen 5). fp32 runs MKL's GEMM, which compiles nothing.
DECODE_KEY_BUCKET = 64


def decode_key_span(end: int, capacity: int) -> int:
    """Keys a one-query attention reads when the cache holds `end`: the next multiple of
    `DECODE_KEY_BUCKET` (at most `capacity`)."""
    return min(capacity, -(-end // DECODE_KEY_BUCKET) * DECODE_KEY_BUCKET)


def compiles_per_shape(t: torch.Tensor) -> bool:
    """Whether a matmul on `t` goes through oneDNN's per-shape kernels (reduced precision, CPU)."""
    return t.device.type == "cpu" and t.dtype in (torch.bfloat16, torch.float16)


class KVCache:
    """Preallocated keys/values of one request; `forward` writes in place and advances `length`.

    keys/values: (layers, batch, kv_heads, capacity, head_dim). Capacity is fixed up front
    (prompt + longest allowed generation), so decoding never reallocates or concatenates.
    """

    def __init__(
        self,
        config: Qwen2Config,
        capacity: int,
        *,
        batch: int = 1,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if capacity > config.max_position_embeddings:
            raise InvalidRequestError(
                f"sequence of {capacity} positions exceeds max_position_embeddings "
                f"{config.max_position_embeddings}"
            )
        shape = (config.num_layers, batch, config.num_kv_heads, capacity, config.head_dim)
        # Uninitialised on purpose: attention reads positions already written, and a decode
        # step's key span past them only once `readable` has zeroed it.
        self.keys = torch.empty(shape, device=device, dtype=dtype)
        self.values = torch.empty(shape, device=device, dtype=dtype)
        self.capacity = capacity
        self.length = 0
        self.zeroed = 0  # positions from `length` up to here are zeros (or written since)

    @classmethod
    def over(cls, keys: torch.Tensor, values: torch.Tensor) -> KVCache:
        """A cache writing into existing (layers, 1, kv_heads, capacity, head_dim) tensors,
        e.g. one row of a batch cache (`llm_batch.BatchKVCache`): no allocation."""
        cache = cls.__new__(cls)
        cache.keys, cache.values = keys, values
        cache.capacity = keys.shape[3]
        cache.length = 0
        cache.zeroed = 0
        return cache

    def readable(self, span: int) -> None:
        """Make positions up to `span` finite (zeros where nothing was written): a masked key's
        probability is exactly 0, but 0 x an uninitialised NaN is not."""
        if span > self.zeroed:
            first = max(self.length, self.zeroed)
            self.keys[..., first:span, :].zero_()
            self.values[..., first:span, :].zero_()
            self.zeroed = span

    def reserve(self, new_positions: int) -> int:
        """Claim the next `new_positions` positions: returns where they start, advances `length`."""
        if self.length + new_positions > self.capacity:
            raise InvalidRequestError(
                f"KV cache full: {self.length} + {new_positions} positions > capacity "
                f"{self.capacity}"
            )
        start = self.length
        self.length += new_positions
        return start


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, as HF Qwen2 does for every dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., dim) -> (..., dim)."""
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rotary_cos_sin(
    config: Qwen2Config, start: int, count: int, device: torch.device, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (count, head_dim) for positions start..start+count-1, in HF's float32 order."""
    positions = torch.arange(start, start + count, device=device)
    return rotary_at(config, positions, dtype)


def rotary_at(
    config: Qwen2Config, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (len(positions), head_dim) at the given integer positions (one per batch row
    when decoding a batch whose rows have different lengths)."""
    device = positions.device
    half = torch.arange(0, config.head_dim, 2, dtype=torch.int64, device=device).float()
    inv_freq = 1.0 / (config.rope_theta ** (half / config.head_dim))
    angles = positions.float()[:, None] * inv_freq[None, :]  # (count, head_dim/2)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, T, heads, head_dim); cos/sin: (T, head_dim). Rotate-half convention."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Qwen2Attention(nn.Module):
    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        self.config = config
        self.q_proj = Linear(config.hidden_size, config.hidden_size, bias=True)
        self.k_proj = Linear(config.hidden_size, config.kv_dim, bias=True)
        self.v_proj = Linear(config.hidden_size, config.kv_dim, bias=True)
        self.o_proj = Linear(config.hidden_size, config.hidden_size, bias=False)
        self.qkv_proj: Linear | None = None  # set by `fuse_projections` (then q/k/v are empty)

    def qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (..., hidden) -> q (..., hidden), k and v (..., kv_dim): one product when fused."""
        if self.qkv_proj is None:
            return self.q_proj(x), self.k_proj(x), self.v_proj(x)
        c = self.config
        q, k, v = self.qkv_proj(x).split([c.hidden_size, c.kv_dim, c.kv_dim], dim=-1)
        return q, k, v

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache | None,
        layer: int,
    ) -> torch.Tensor:
        """x: (B, T, hidden), the T positions the cache just reserved (its last T; 0.. without
        a cache) -> (B, T, hidden)."""
        c = self.config
        b, t, _ = x.shape
        groups = c.num_heads // c.num_kv_heads
        q_rows, k_rows, v_rows = self.qkv(x)
        q = apply_rotary(q_rows.view(b, t, c.num_heads, c.head_dim), *rotary)
        k = apply_rotary(k_rows.view(b, t, c.num_kv_heads, c.head_dim), *rotary)
        v = v_rows.view(b, t, c.num_kv_heads, c.head_dim)
        start = 0 if cache is None else cache.length - t
        if cache is None:
            keys, values = k.transpose(1, 2), v.transpose(1, 2)  # (B, kvh, T, hd)
        else:
            cache.keys[layer, :, :, start : start + t].copy_(k.transpose(1, 2))
            cache.values[layer, :, :, start : start + t].copy_(v.transpose(1, 2))
            span = start + t
            if t == 1 and compiles_per_shape(x):
                span = decode_key_span(start + t, cache.capacity)
                cache.readable(span)  # all layers at once, when the step enters a new bucket
            keys = cache.keys[layer, :, :, :span]
            values = cache.values[layer, :, :, :span]
        # Query head h uses KV head h // groups: fold the groups into the query rows.
        q = q.view(b, t, c.num_kv_heads, groups, c.head_dim).permute(0, 2, 3, 1, 4)
        q = q.reshape(b, c.num_kv_heads, groups * t, c.head_dim)  # rows ordered (group, t)
        scores = torch.matmul(q, keys.transpose(-1, -2)) * (1.0 / math.sqrt(c.head_dim))
        if keys.size(2) > start + t:  # a decode step's bucket: the positions past the end
            scores[..., start + t :] = float("-inf")
        if t > 1:  # query i (absolute start+i) sees keys 0..start+i; one query sees all
            allowed = torch.ones(t, start + t, dtype=torch.bool, device=x.device).tril(start)
            scores = scores.masked_fill(~allowed.repeat(groups, 1), float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
        out = torch.matmul(probs, values).view(b, c.num_kv_heads, groups, t, c.head_dim)
        out = out.permute(0, 3, 1, 2, 4).reshape(b, t, c.hidden_size)
        return self.o_proj(out)


class Qwen2MLP(nn.Module):
    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        self.gate_proj = Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.gate_up_proj: Linear | None = None  # set by `fuse_projections`

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, T, hidden) -> (B, T, hidden)."""
        if self.gate_up_proj is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        self.self_attn = Qwen2Attention(config)
        self.mlp = Qwen2MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        rotary: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache | None,
        layer: int,
    ) -> torch.Tensor:
        """x: (B, T, hidden) -> (B, T, hidden)."""
        x = x + self.self_attn(self.input_layernorm(x), rotary, cache, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen2Model(nn.Module):
    """HF `Qwen2Model` parameters: embed_tokens, layers.N.*, norm. Runs on input embeddings."""

    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = mapped_table_embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Qwen2DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, inputs_embeds: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """inputs_embeds: (B, T, hidden) -> final-norm hidden states (B, T, hidden).

        Without a cache: full causal attention over the T positions. With one: the T positions
        follow the cache's `length` earlier ones; their keys/values are written into it and its
        length advances by T.
        """
        t = inputs_embeds.shape[1]
        start = 0 if cache is None else cache.reserve(t)
        rotary = rotary_cos_sin(self.config, start, t, inputs_embeds.device, inputs_embeds.dtype)
        x = inputs_embeds
        for index, layer in enumerate(self.layers):
            x = layer(x, rotary, cache, index)
        return self.norm(x)


class TiedLMHead(nn.Module):
    """Holds `lm_head.weight` as the very same Parameter as `embed_tokens.weight`.

    Official llm.pt files store the tied head (a strict load needs the key). CosyVoice never
    computes it, so neither do we; aliasing lists the key at no memory cost.
    """

    def __init__(self, embed_tokens: nn.Embedding) -> None:
        super().__init__()
        self.weight = embed_tokens.weight


class Qwen2ForCausalLM(nn.Module):
    """The `model` + `lm_head` key layout of HF `Qwen2ForCausalLM` (the head is never run)."""

    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        self.model = Qwen2Model(config)
        self.lm_head = TiedLMHead(self.model.embed_tokens)

    def tie_weights(self) -> None:
        """Re-alias the head after `load_state_dict(assign=True)` replaced either Parameter."""
        self.lm_head.weight = self.model.embed_tokens.weight
