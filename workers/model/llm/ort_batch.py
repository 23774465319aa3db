"""Continuous batching of the int8 LLM step in ONNX Runtime: `BatchDecoder`'s rows, ORT's step.

`OrtBatchDecoder` is a `RowBatch` (`batch.py`): rows join and leave between steps, each row
validated, sampled and retired exactly as in the torch decoder (its own plan, generator and
bounds). What differs is where the keys and values live and who runs the step:

- `OrtRowCache` holds one float32 buffer per layer for keys and one for values, (rows,
  kv_heads, positions, head_dim), allocated once and never copied per step. ONNX Runtime reads
  and writes that memory in place through IO bindings over views of it (`OrtSpeechLM.bind_kv`):
  one binding per slot (a batch-1 view, where a joining row's prefill runs: the very call and
  shapes of the alone path, `OrtSpeechLM.step_logp`) and one per row count n (a view of the
  first n rows, where a step runs). Bindings are made on first use and kept.
- Ragged rows: the step graph takes each row's length (`seqlens_k`); GroupQueryAttention
  places each row's new key/value at its own length, rotates it at its own position and
  attends to that row's positions only, so rows of any lengths share one step with no padding
  mask of ours. Active rows are kept in slots 0..n-1 (a leaving row's slot takes the last
  row's filled positions, `move`), as in the torch decoder, so a step's view is contiguous.

The graph is the single-row path's file (`ort_cache_path`): its batch dimension is symbolic,
so the batched rows need no other graph, and a recycled worker opens it from the cache.
"""

from __future__ import annotations

import numpy as np
import torch

from workers.model.llm.batch import RowBatch
from workers.model.llm.ort_decoder import STATE_ATTRIBUTE, OrtKV, OrtSpeechLM
from workers.model.llm.qwen2 import KVCache
from workers.model.llm.sampling import SamplingConfig


class OrtRowCache:
    """The batch's keys and values in ONNX Runtime's memory (see the module docstring)."""

    def __init__(self, llm: OrtSpeechLM, rows: int, positions: int) -> None:
        backbone = llm.config.backbone
        if rows < 1 or positions < 1:
            raise ValueError(f"a batch cache needs rows >= 1 and positions >= 1 ({rows=})")
        positions = min(positions, backbone.max_position_embeddings)
        shape = (rows, backbone.num_kv_heads, positions, backbone.head_dim)
        # zeros: a row only ever attends to its own filled positions, but nothing in the
        # buffers is ever uninitialised memory
        self.keys = [np.zeros(shape, dtype=np.float32) for _ in range(backbone.num_layers)]
        self.values = [np.zeros(shape, dtype=np.float32) for _ in range(backbone.num_layers)]
        self.llm = llm
        self.rows = rows
        self.positions = positions
        self.lengths = [0] * rows
        self._slots: dict[int, OrtKV] = {}
        self._firsts: dict[int, OrtKV] = {}

    def row(self, slot: int) -> KVCache:
        """Slot `slot` as the alone path's cache: its torch tensors are empty (they only
        count positions), its ORT buffers a view of the slot."""
        if slot not in self._slots:
            self._slots[slot] = self._view(slot, slot + 1)
        shape = (0, 1, 0, self.positions, 0)
        cache = KVCache.over(torch.empty(shape), torch.empty(shape))
        setattr(cache, STATE_ATTRIBUTE, self._slots[slot])
        return cache

    def first(self, n: int) -> OrtKV:
        """Slots 0..n-1, bound for one step of n rows."""
        if n not in self._firsts:
            self._firsts[n] = self._view(0, n)
        return self._firsts[n]

    def move(self, source: int, target: int) -> None:
        n = self.lengths[source]
        for buffer in (*self.keys, *self.values):
            buffer[target, :, :n] = buffer[source, :, :n]
        self.lengths[target] = n
        self.lengths[source] = 0

    def nbytes(self) -> int:
        return sum(buffer.nbytes for buffer in (*self.keys, *self.values))

    def _view(self, start: int, stop: int) -> OrtKV:
        keys = [buffer[start:stop] for buffer in self.keys]  # contiguous: rows are outermost
        values = [buffer[start:stop] for buffer in self.values]
        return self.llm.bind_kv(keys, values)


class OrtBatchDecoder(RowBatch):
    """`RowBatch` over the int8 ORT step: `rows` rows of `positions` positions at most."""

    model: OrtSpeechLM
    cache: OrtRowCache

    def __init__(
        self,
        model: OrtSpeechLM,
        rows: int,
        positions: int,
        *,
        sampling: SamplingConfig | None = None,
    ) -> None:
        super().__init__(model, OrtRowCache(model, rows, positions), sampling)

    def _forward(self) -> None:
        """Every row's last token at its own length, one ORT run for the n rows."""
        n = len(self.rows)
        weight = self.model.speech_embedding.weight
        ids = torch.tensor([row.tokens[-1] for row in self.rows])
        embeds = weight[ids].unsqueeze(1).float().numpy()  # (n, 1, hidden)
        lengths = np.array(self.cache.lengths[:n], dtype=np.int32)
        logp = self.model.run_rows(self.cache.first(n), embeds, lengths)  # (n, V)
        self._took_step(torch.from_numpy(logp))
