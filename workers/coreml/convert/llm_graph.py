"""The LLM as a traceable step over a KV cache held in buffers (Core ML state, macOS 15).

`StatefulLLMGraph` runs `Qwen2LM`'s own layers (projections, RMSNorm, MLP, rotary helper,
llm_decoder) on T new positions after E - T cached ones and returns the log-probabilities of
the next speech token. The keys and values live in two registered buffers, which coremltools
turns into `ct.StateType` states updated in place; the position comes from the shapes:
`causal_mask` is (1, 1, T, E), so the new positions are E - T .. E - 1 (the pattern of Apple's
stateful-LLM examples; no tensor-valued index is traced). The mask is additive: 0 where a query
may attend, `MASK_NEGATIVE` elsewhere (finite, so fp16 stays free of -inf arithmetic).
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import Tensor, nn

from workers.model.llm.model import Qwen2LM
from workers.model.llm.qwen2 import Qwen2DecoderLayer, apply_rotary

MASK_NEGATIVE = -3.0e4  # additive mask value: exp() underflows to 0, and fp16 can hold it


def causal_mask(start: int, count: int) -> Tensor:
    """(1, 1, count, start + count): new position i (absolute start + i) sees keys <= it."""
    keys = torch.arange(start + count)
    queries = torch.arange(start, start + count)
    allowed = keys[None, :] <= queries[:, None]
    zero = torch.zeros((), dtype=torch.float32)
    return torch.where(allowed, zero, torch.tensor(MASK_NEGATIVE))[None, None]


class StatefulLLMGraph(nn.Module):
    """inputs_embeds (1, T, hidden), causal_mask (1, 1, T, E) -> logits (1, speech vocab + 3).

    Logits, not log-probs: the log-softmax runs in float32 in the runtime, where an fp16
    `log(softmax)` would turn every probability below 6e-8 into -inf.
    """

    k_cache: Tensor
    v_cache: Tensor
    inv_freq: Tensor

    def __init__(self, llm: Qwen2LM, capacity: int) -> None:
        super().__init__()
        self.llm = llm
        cfg = llm.config.backbone
        self.capacity = capacity
        shape = (cfg.num_layers, 1, cfg.num_kv_heads, capacity, cfg.head_dim)
        self.register_buffer("k_cache", torch.zeros(shape))
        self.register_buffer("v_cache", torch.zeros(shape))
        half = torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float()
        inv_freq = 1.0 / (cfg.rope_theta ** (half / cfg.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, inputs_embeds: Tensor, causal_mask: Tensor) -> Tensor:
        """New positions E - T .. E - 1 -> logits of the token after the last one."""
        count, end = inputs_embeds.size(1), causal_mask.size(-1)
        positions = torch.arange(end - count, end, dtype=torch.float32)
        angles = positions[:, None] * self.inv_freq[None, :]  # (T, head_dim / 2)
        angles = torch.cat((angles, angles), dim=-1)
        rotary = (angles.cos(), angles.sin())
        backbone = self.llm.backbone
        x = inputs_embeds
        for index, layer in enumerate(cast(list[Qwen2DecoderLayer], backbone.layers)):
            x = x + self._attention(layer, layer.input_layernorm(x), rotary, causal_mask, index)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.llm.llm_decoder(backbone.norm(x)[:, -1])

    def _attention(
        self,
        layer: Qwen2DecoderLayer,
        x: Tensor,
        rotary: tuple[Tensor, Tensor],
        mask: Tensor,
        index: int,
    ) -> Tensor:
        """x (1, T, hidden) -> (1, T, hidden); writes this layer's keys/values at E - T .. E-1."""
        attn, c = layer.self_attn, self.llm.config.backbone
        t, end = x.size(1), mask.size(-1)
        groups = c.num_heads // c.num_kv_heads
        q = apply_rotary(attn.q_proj(x).view(1, t, c.num_heads, c.head_dim), *rotary)
        k = apply_rotary(attn.k_proj(x).view(1, t, c.num_kv_heads, c.head_dim), *rotary)
        v = attn.v_proj(x).view(1, t, c.num_kv_heads, c.head_dim)
        self.k_cache[index : index + 1, :, :, end - t : end] = k.transpose(1, 2).unsqueeze(0)
        self.v_cache[index : index + 1, :, :, end - t : end] = v.transpose(1, 2).unsqueeze(0)
        keys = self.k_cache[index, :, :, :end]  # (1, kv_heads, E, head_dim)
        values = self.v_cache[index, :, :, :end]
        q = q.view(1, t, c.num_kv_heads, groups, c.head_dim).permute(0, 2, 3, 1, 4)
        q = q.reshape(1, c.num_kv_heads, groups * t, c.head_dim)  # rows ordered (group, t)
        scores = torch.matmul(q, keys.transpose(-1, -2)) * (1.0 / math.sqrt(c.head_dim))
        scores = scores + mask[0].repeat(1, groups, 1)  # (1, groups * T, E) per kv head
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, values).view(1, c.num_kv_heads, groups, t, c.head_dim)
        return attn.o_proj(out.permute(0, 3, 1, 2, 4).reshape(1, t, c.hidden_size))
