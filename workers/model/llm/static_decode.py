"""The LLM's batched decode step over a static KV cache, in gpt-fast's manner, for CUDA.

On a GPU a decode step costs kernel launches, not bytes: ~24 layers x ~15 kernels, each a few
microseconds of work. The fast servers launch the whole step as one captured CUDA graph, which
needs a step whose every shape and address is fixed:
- the cache is `BatchKVCache`'s (layers, rows, kv_heads, positions, head_dim), allocated once;
  a step over `bucket` rows reads its first `bucket` rows (a fixed view of fixed storage);
- the step is `decode_step`, a plain function of (model, keys, values, tokens, positions): each
  row's new key/value written at its own position (`index_put_`), attention over every position
  through `F.scaled_dot_product_attention` with the keys past each row's position masked, no
  Python branch on a tensor value, no `.item()`, no allocation that depends on the data;
- a batch of n rows runs in the smallest bucket >= n (`bucket_for`); the padding rows read
  token 0 at position 0 of free cache rows, which the next row added there overwrites
  (its prefill starts at position 0), and their output is never read;
- `StaticDecoder` keeps the input buffers and, on CUDA, one graph per bucket (`GraphKey`),
  captured on first use or ahead by `capture` (warm-up), all buckets in one memory pool.
On the CPU the same step runs eagerly (no capture): the tests compare its log-probs with the
dynamic path's (`BatchDecoder`'s span-limited step), which stays the CPU's choice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F

from workers.model.llm.model import Qwen2LM
from workers.model.llm.qwen2 import Qwen2DecoderLayer, rotary_at

# Rows a graph is captured for: powers of two up to 16, then steps of 16 up to 64 and of 32 up
# to 128, so padding stays under a third of a bucket past 8 rows (each bucket is one graph:
# ~10 buckets x a few MB of graph memory).
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)

DecodeStep = Callable[..., torch.Tensor]


def buckets_for(rows: int, buckets: Sequence[int] = BATCH_BUCKETS) -> tuple[int, ...]:
    """The buckets a cache of `rows` rows uses: those below `rows`, then `rows` itself."""
    if rows < 1:
        raise ValueError(f"a static decoder needs rows >= 1, got {rows}")
    return (*(b for b in sorted(buckets) if b < rows), rows)


def bucket_for(n: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds `n` rows (`buckets` ascending, as `buckets_for` gives)."""
    for bucket in buckets:
        if bucket >= n:
            return bucket
    raise ValueError(f"{n} rows exceed the largest bucket {buckets[-1]}")


@dataclass(frozen=True)
class GraphKey:
    """What one captured graph is specific to."""

    device: str
    dtype: str
    bucket: int
    positions: int

    @property
    def name(self) -> str:
        return f"{self.device}/{self.dtype}/b{self.bucket}/p{self.positions}"


def decode_step(
    model: Qwen2LM,
    keys: torch.Tensor,
    values: torch.Tensor,
    tokens: torch.Tensor,
    positions: torch.Tensor,
) -> torch.Tensor:
    """One token for each of B rows -> float32 log-probs (B, V) of the next one.

    keys/values (layers, B, kv_heads, P, head_dim) are written in place at `positions`;
    tokens (B,) speech ids, positions (B,) long: where each row's new token goes (its length).
    """
    backbone = model.backbone
    config = backbone.config
    x = model.speech_embedding.weight[tokens].unsqueeze(1)  # (B, 1, hidden)
    cos, sin = rotary_at(config, positions, x.dtype)
    span = keys.shape[3]
    visible = torch.arange(span, device=x.device)[None, :] <= positions[:, None]  # (B, P)
    mask = visible[:, None, None, :]  # (B, 1, 1, P): every kv head, every folded query
    rows = torch.arange(tokens.shape[0], device=x.device)
    for index, module in enumerate(backbone.layers):
        layer = cast(Qwen2DecoderLayer, module)
        h = layer.input_layernorm(x)
        x = x + _attention(layer, h, (cos, sin), keys[index], values[index], rows, positions, mask)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.llm_decoder(backbone.norm(x)[:, -1]).float().log_softmax(dim=-1)


def _attention(  # noqa: PLR0917 - one call site, the layer loop's values
    layer: Qwen2DecoderLayer,
    x: torch.Tensor,
    rotary: tuple[torch.Tensor, torch.Tensor],
    keys: torch.Tensor,
    values: torch.Tensor,
    rows: torch.Tensor,
    positions: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """x (B, 1, hidden) -> (B, 1, hidden); one layer's keys/values (B, kvh, P, hd)."""
    attn = layer.self_attn
    c = attn.config
    b = x.shape[0]
    groups = c.num_heads // c.num_kv_heads
    cos, sin = rotary
    q_rows, k_rows, v_rows = attn.qkv(x)
    q = _rotate(q_rows.view(b, c.num_heads, c.head_dim), cos, sin)
    k = _rotate(k_rows.view(b, c.num_kv_heads, c.head_dim), cos, sin)
    keys[rows, :, positions] = k  # row r's new key at its own position (one index_put_)
    values[rows, :, positions] = v_rows.view(b, c.num_kv_heads, c.head_dim)
    # Query head h uses kv head h // groups: the groups become query rows of their kv head.
    q = q.view(b, c.num_kv_heads, groups, c.head_dim)
    out = F.scaled_dot_product_attention(
        q, keys, values, attn_mask=mask, scale=1.0 / math.sqrt(c.head_dim)
    )  # (B, kvh, groups, hd)
    return attn.o_proj(out.reshape(b, 1, c.hidden_size))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE with one position per row: x (B, heads, hd), cos/sin (B, hd)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class StaticDecoder:
    """Runs `decode_step` over the first `bucket` rows of a fixed cache; on CUDA (`graphs`),
    as one captured graph per bucket.

    keys/values: the cache tensors (layers, rows, kv_heads, positions, head_dim), never
    reallocated. `step_fn` replaces `decode_step` (e.g. its `torch.compile`d form)."""

    def __init__(
        self,
        model: Qwen2LM,
        keys: torch.Tensor,
        values: torch.Tensor,
        *,
        graphs: bool,
        step_fn: DecodeStep | None = None,
    ) -> None:
        device = keys.device
        if graphs and device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA cache, not {device}")
        self.model = model
        self.keys, self.values = keys, values
        self.buckets = buckets_for(keys.shape[1])
        self.tokens = torch.zeros(keys.shape[1], dtype=torch.long, device=device)
        self.positions = torch.zeros(keys.shape[1], dtype=torch.long, device=device)
        self.use_graphs = graphs
        self.step_fn: DecodeStep = step_fn or decode_step
        self._graphs: dict[int, tuple[Any, torch.Tensor]] = {}  # bucket -> (graph, output)
        self._pool: Any = None

    def key(self, bucket: int) -> GraphKey:
        dtype = str(self.keys.dtype).removeprefix("torch.")
        return GraphKey(str(self.keys.device), dtype, bucket, self.keys.shape[3])

    @property
    def captured(self) -> tuple[GraphKey, ...]:
        return tuple(self.key(b) for b in sorted(self._graphs))

    def run(self, tokens: Sequence[int], lengths: Sequence[int]) -> torch.Tensor:
        """Rows 0..n-1 decode `tokens` at positions `lengths` -> log-probs (n, V)."""
        n = len(tokens)
        bucket = bucket_for(n, self.buckets)
        self.tokens[:bucket].zero_()
        self.positions[:bucket].zero_()
        self.tokens[:n].copy_(torch.tensor(list(tokens), dtype=torch.long), non_blocking=True)
        self.positions[:n].copy_(torch.tensor(list(lengths), dtype=torch.long), non_blocking=True)
        if not self.use_graphs:
            return self._eager(bucket)[:n]
        if bucket not in self._graphs:
            self._capture(bucket)
        graph, output = self._graphs[bucket]
        graph.replay()
        return output[:n]

    def capture(self, buckets: Sequence[int] | None = None) -> tuple[GraphKey, ...]:
        """Capture every bucket ahead (warm-up, with no row in the cache: the capture's warm-up
        steps write padding keys into position 0 of every row). Largest first: one pool."""
        if self.use_graphs:
            for bucket in sorted(buckets or self.buckets, reverse=True):
                self.tokens[:bucket].zero_()
                self.positions[:bucket].zero_()
                if bucket not in self._graphs:
                    self._capture(bucket)
        return self.captured

    def _eager(self, bucket: int) -> torch.Tensor:
        return self.step_fn(
            self.model,
            self.keys[:, :bucket],
            self.values[:, :bucket],
            self.tokens[:bucket],
            self.positions[:bucket],
        )

    def _capture(self, bucket: int) -> None:
        """Warm up on a side stream (allocator, cuBLAS handles), then record one step. The
        warm-up steps write the same keys/values the replay writes: nothing is lost."""
        cuda = torch.cuda
        side = cuda.Stream()
        side.wait_stream(cuda.current_stream())
        with cuda.stream(side):
            for _ in range(2):
                self._eager(bucket)
        cuda.current_stream().wait_stream(side)
        if self._pool is None:
            self._pool = cuda.graph_pool_handle()
        graph = cuda.CUDAGraph()
        with cuda.graph(graph, pool=self._pool):
            output = self._eager(bucket)
        self._graphs[bucket] = (graph, output)
