"""Continuous batching of the LLM: many pieces decode together, one batched forward per step.

Why: a decode step of the full model reads all of its weights to make one token; with B rows
the same read makes B tokens. Rows join and leave between steps:
- `add` validates a piece exactly as the alone path does (`plan_decode`), then prefills it on
  its own into a free row of the preallocated `BatchKVCache` (the very code and shapes of the
  alone prefill, written into the row's slice);
- `step` samples one token for every row from its own log-probs with its own generator (RAS,
  `forced_length` and the length bounds as alone), retires the rows that sampled a stop id or
  reached their bound, then runs one forward for the rest: per-row RoPE positions, each row's
  new key/value written at its own length, attention masked to its own positions.
Active rows are kept in slots 0..n-1 (a leaving row's slot takes the last row's cache), so
every step reads contiguous slices. Sampling matches the alone path draw for draw; the logits
differ from alone only by matmul rounding (batched GEMMs), which the tests bound. `RowBatch`
holds that bookkeeping; `BatchDecoder` is its torch step over `BatchKVCache`,
`ort_batch.OrtBatchDecoder` the int8 ONNX Runtime step's.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

import numpy as np
import torch

from shared.errors import InvalidRequestError
from workers.model.llm.model import (
    DecodePlan,
    Qwen2LM,
    SpeechLM,
    StopKind,
    plan_decode,
    stop_kind,
)
from workers.model.llm.qwen2 import (
    KVCache,
    Qwen2Attention,
    Qwen2Config,
    Qwen2DecoderLayer,
    compiles_per_shape,
    decode_key_span,
    rotary_at,
)
from workers.model.llm.sampling import SamplingConfig, ras_sampling
from workers.model.llm.static_decode import DecodeStep, StaticDecoder


class RowTooLong(Exception):
    """A piece needs more positions than a batch row holds (the caller runs it alone)."""


class BatchKVCache:
    """keys/values (layers, rows, kv_heads, positions, head_dim), zero-filled once.

    Zeros, not `empty`: a row's attention multiplies the masked positions' values by exactly
    0, which must not meet a NaN left in uninitialised memory.
    """

    def __init__(
        self,
        config: Qwen2Config,
        rows: int,
        positions: int,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if rows < 1 or positions < 1:
            raise ValueError(f"a batch cache needs rows >= 1 and positions >= 1 ({rows=})")
        positions = min(positions, config.max_position_embeddings)
        shape = (config.num_layers, rows, config.num_kv_heads, positions, config.head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)
        self.values = torch.zeros(shape, device=device, dtype=dtype)
        self.rows = rows
        self.positions = positions
        self.lengths = [0] * rows

    def row(self, slot: int) -> KVCache:
        """Slot `slot` as a batch-1 cache (views, no copy): the alone prefill writes into it."""
        return KVCache.over(self.keys[:, slot : slot + 1], self.values[:, slot : slot + 1])

    def move(self, source: int, target: int) -> None:
        """Copy row `source`'s filled positions into row `target` (compaction)."""
        n = self.lengths[source]
        self.keys[:, target, :, :n].copy_(self.keys[:, source, :, :n])
        self.values[:, target, :, :n].copy_(self.values[:, source, :, :n])
        self.lengths[target] = n
        self.lengths[source] = 0

    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() * 2


@dataclass
class DecodeRow:
    """One piece being decoded: owner key, randomness, bounds and what it produced so far."""

    key: Hashable
    plan: DecodePlan
    generator: torch.Generator
    logp: torch.Tensor  # (V,) float32 log-probs of the next token
    tokens: list[int] = field(default_factory=list)
    steps_shared: int = 1  # the most rows in any forward this row took part in

    @property
    def done(self) -> bool:
        return len(self.tokens) >= self.plan.bounds[1]


@dataclass(frozen=True)
class FinishedRow:
    key: Hashable
    tokens: list[int]  # speech ids, stop id excluded
    batch_size: int  # the most rows that shared a forward with this one
    stop: StopKind = "unknown"  # how decoding ended (a sampled stop id, the length bound)


class RowCache(Protocol):
    """Where a batch keeps its rows' keys and values: `BatchKVCache` here, the int8 step's
    buffers in ONNX Runtime's memory (`ort_batch.OrtRowCache`)."""

    rows: int
    positions: int
    lengths: list[int]  # filled positions per slot

    def row(self, slot: int) -> KVCache:
        """Slot `slot` as a batch-1 cache: the alone prefill writes into it."""
        ...

    def move(self, source: int, target: int) -> None:
        """Copy row `source`'s filled positions into row `target` (compaction)."""
        ...


class RowBatch:
    """Rows in, finished token lists out; one batched forward per `step`.

    The bookkeeping every batched decoder shares (validation, the alone prefill into a free
    slot, sampling, retiring, compaction); a subclass supplies the cache and `_forward`."""

    def __init__(self, model: SpeechLM, cache: RowCache, sampling: SamplingConfig | None) -> None:
        self.model = model
        self.sampling = sampling or model.config.sampling
        self.cache = cache
        self.rows: list[DecodeRow] = []  # row i lives in cache slot i
        self._finished: list[FinishedRow] = []

    @property
    def free(self) -> int:
        return self.cache.rows - len(self.rows)

    def clear(self) -> None:
        """Drop every row (after a failed step: the caller reruns their owners alone)."""
        self.rows.clear()
        self._finished.clear()
        self.cache.lengths = [0] * self.cache.rows

    @torch.inference_mode()
    def add(
        self,
        key: Hashable,
        text: Sequence[int],
        *,
        prompt_text: Sequence[int],
        prompt_speech: torch.Tensor | Sequence[int] | np.ndarray,
        generator: torch.Generator,
        forced_length: int | None = None,
    ) -> None:
        """Validate and prefill one piece. InvalidRequestError as alone; RowTooLong when it
        fits alone but not in a row; ValueError when no row is free."""
        plan = plan_decode(
            self.model,
            list(text),
            prompt_text=list(prompt_text),
            prompt_speech=torch.as_tensor(np.asarray(prompt_speech, dtype=np.int64)),
            sampling=self.sampling,
            forced_length=forced_length,
        )
        needed = plan.positions()
        if needed > self.model.config.backbone.max_position_embeddings:
            raise InvalidRequestError(
                f"sequence of {needed} positions exceeds max_position_embeddings "
                f"{self.model.config.backbone.max_position_embeddings}"
            )
        if needed > self.cache.positions:
            raise RowTooLong(f"{needed} positions > {self.cache.positions} per batch row")
        if not self.free:
            raise ValueError("no free row in the batch")
        slot = len(self.rows)
        cache = self.cache.row(slot)
        logp = self.model.step_logp(self.model.prefix_embeddings(*plan.inputs), cache)
        self.cache.lengths[slot] = cache.length
        row = DecodeRow(key, plan, generator, logp)
        self.rows.append(row)
        if plan.bounds[1] == 0:  # nothing to generate: leaves at the next step untouched
            self._retire(slot, sampled_stop=False)

    @torch.inference_mode()
    def step(self) -> list[FinishedRow]:
        """Sample every row once, retire the finished ones, one forward for the others."""
        config = self.model.config
        for slot in range(len(self.rows) - 1, -1, -1):  # backwards: retiring moves the last
            row = self.rows[slot]
            if len(row.tokens) < row.plan.bounds[0]:
                row.logp[row.plan.masked] = float("-inf")
            token = ras_sampling(row.logp, row.tokens, self.sampling, row.generator)
            if token in config.stop_tokens:
                self._retire(slot, sampled_stop=True)
                continue
            row.tokens.append(token)
            if row.done:
                self._retire(slot, sampled_stop=False)
        if self.rows:
            self._forward()
        finished, self._finished = self._finished, []
        return finished

    def drop(self, key: Hashable) -> bool:
        """Remove `key`'s row between steps without finishing it (its owner was canceled):
        the slot is free at once and the other rows go on untouched."""
        for slot, row in enumerate(self.rows):
            if row.key is key:
                self._retire(slot, sampled_stop=False)
                self._finished.pop()  # the FinishedRow `_retire` just noted: never reported
                return True
        return False

    def _retire(self, slot: int, *, sampled_stop: bool) -> None:
        row = self.rows[slot]
        stop = stop_kind(sampled_stop=sampled_stop, forced=row.plan.forced)
        self._finished.append(FinishedRow(row.key, row.tokens, row.steps_shared, stop))
        last = len(self.rows) - 1
        if slot != last:
            self.cache.move(last, slot)
            self.rows[slot] = self.rows[last]
        self.cache.lengths[last] = 0
        self.rows.pop()

    def _forward(self) -> None:
        """One new position for every row (its last token), then `_took_step`."""
        raise NotImplementedError

    def _took_step(self, logp: torch.Tensor) -> None:
        """Each row's next log-probs (rows, V) in, its length one longer."""
        n = len(self.rows)
        for slot, row in enumerate(self.rows):
            self.cache.lengths[slot] += 1
            row.logp = logp[slot]
            row.steps_shared = max(row.steps_shared, n)


class BatchDecoder(RowBatch):
    """The torch batched decoder: `BatchKVCache`, one batched forward of `Qwen2LM` per step."""

    model: Qwen2LM
    cache: BatchKVCache

    def __init__(
        self,
        model: Qwen2LM,
        rows: int,
        positions: int,
        *,
        sampling: SamplingConfig | None = None,
        static: bool = False,
        graphs: bool = False,
        step_fn: DecodeStep | None = None,
    ) -> None:
        """`static`: decode through `static_decode` (the kernel policy's choice on CUDA), with
        one CUDA graph per batch bucket where `graphs`; `step_fn` replaces its step function
        (a `torch.compile`d one)."""
        cache = BatchKVCache(
            model.config.backbone,
            rows,
            positions,
            device=model.device,
            dtype=model.llm_decoder.weight.dtype,
        )
        super().__init__(model, cache, sampling)
        self.static: StaticDecoder | None = None
        if static or graphs:
            self.static = StaticDecoder(
                model, self.cache.keys, self.cache.values, graphs=graphs, step_fn=step_fn
            )

    def _forward(self) -> None:
        n = len(self.rows)
        if self.static is not None:
            tokens = [row.tokens[-1] for row in self.rows]
            # one copy to the CPU per step (sampling runs there): no per-row sync, and a copy
            # the next graph replay cannot overwrite
            self._took_step(self.static.run(tokens, self.cache.lengths[:n]).to("cpu"))
            return
        model = self.model
        weight = model.speech_embedding.weight
        ids = torch.tensor([row.tokens[-1] for row in self.rows], device=weight.device)
        x = weight[ids].unsqueeze(1)  # (n, 1, hidden)
        lengths = torch.tensor(self.cache.lengths[:n], device=weight.device)
        backbone = model.backbone
        cos, sin = rotary_at(backbone.config, lengths, x.dtype)
        span = int(lengths.max()) + 1
        if compiles_per_shape(x):  # whole buckets of keys (the rows' ends masked as before)
            span = decode_key_span(span, self.cache.positions)
        hidden_mask = torch.arange(span, device=x.device)[None, :] > lengths[:, None]
        for index, module in enumerate(backbone.layers):
            layer = cast(Qwen2DecoderLayer, module)
            h = layer.input_layernorm(x)
            x = x + _batched_attention(
                layer.self_attn, h, (cos, sin), self.cache, index, lengths, hidden_mask
            )
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self._took_step(model.llm_decoder(backbone.norm(x)[:, -1]).float().log_softmax(dim=-1))


def _batched_attention(  # noqa: PLR0917 - one call site, the layer loop's values
    attn: Qwen2Attention,
    x: torch.Tensor,
    rotary: tuple[torch.Tensor, torch.Tensor],
    cache: BatchKVCache,
    layer: int,
    lengths: torch.Tensor,
    masked: torch.Tensor,
) -> torch.Tensor:
    """x (n, 1, hidden), one new position per row at `lengths` -> (n, 1, hidden).

    The same arithmetic as `Qwen2Attention.forward` with one query, per row; `masked` (n, span)
    marks each row's positions past its own end.
    """
    c = attn.config
    n = x.shape[0]
    groups = c.num_heads // c.num_kv_heads
    cos, sin = rotary
    q_rows, k_rows, v_rows = attn.qkv(x)
    q = _rotate(q_rows.view(n, 1, c.num_heads, c.head_dim), cos, sin)
    k = _rotate(k_rows.view(n, 1, c.num_kv_heads, c.head_dim), cos, sin)
    v = v_rows.view(n, 1, c.num_kv_heads, c.head_dim)
    slots = torch.arange(n, device=x.device)
    cache.keys[layer, slots, :, lengths] = k[:, 0]
    cache.values[layer, slots, :, lengths] = v[:, 0]
    span = masked.shape[1]
    keys = cache.keys[layer, :n, :, :span]  # (n, kvh, span, hd)
    values = cache.values[layer, :n, :, :span]
    q = q.view(n, 1, c.num_kv_heads, groups, c.head_dim).permute(0, 2, 3, 1, 4)
    q = q.reshape(n, c.num_kv_heads, groups, c.head_dim)
    scores = torch.matmul(q, keys.transpose(-1, -2)) * (1.0 / math.sqrt(c.head_dim))
    scores = scores.masked_fill(masked[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)
    out = torch.matmul(probs, values).view(n, c.num_kv_heads, groups, 1, c.head_dim)
    out = out.permute(0, 3, 1, 2, 4).reshape(n, 1, c.hidden_size)
    return attn.o_proj(out)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """`apply_rotary` with one position per row: x (n, 1, heads, hd), cos/sin (n, hd)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, None, :] + rotated * sin[:, None, None, :]
