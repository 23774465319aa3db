"""What one streamed flow pass leaves for the next: causal conv tails and attention keys/values.

A pass computes the new positions `start..end` of one network (the encoder at token or frame
rate, or the estimator at one Euler step) from what earlier passes kept. With static chunk masks
a position's value depends only on positions before the end of its chunk, so what a pass may
keep are the positions before a chunk edge (`Span.keep`); positions of a chunk that is not yet
full are computed again by the next pass, which starts at that edge. Per module:
- a causal conv keeps its last kernel-1 inputs (zeros before the first, as its padding was);
- an attention keeps its keys and values, in buffers that grow by half when full (so a pass
  copies no more than a bounded share of them, amortised).
Every allocation asks the piece's `CacheBudget` first: a buffer that would take the cache past
its byte limit is not allocated (`CacheFull`), so the cache never holds more than the limit.
All of it is per-request state: the model's modules are only read. A voice's prompt prefix
can be computed once and `fork`ed by every request of that voice: a fork reads the shared
keys/values where they are and keeps its own positions in buffers of its own (the estimator's
attention reads both segments, `cpu_attention.attention_over`; the small encoder joins them),
so a piece of a primed voice holds only its own positions (conv tails are never written in
place either).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from workers.model.cpu_attention import KeyLimits, reads_segments
from workers.model.cpu_conv import conv1d

GROWTH = 1.5  # key/value buffer capacity factor when a pass needs more


class CacheFull(Exception):
    """An allocation would take a piece's flow cache past its byte limit (nothing allocated)."""


class CacheBudget:
    """The bytes one piece's flow cache holds, checked against `max_bytes` (None: no limit)
    before any buffer is allocated; `peak` is the most it ever held."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self.max_bytes = max_bytes
        self.held = 0
        self.peak = 0

    def replace(self, old_bytes: int, new_bytes: int) -> None:
        """Account a buffer of `old_bytes` replaced by one of `new_bytes`; CacheFull (and
        nothing changed) when the new total would pass the limit."""
        total = self.held - old_bytes + new_bytes
        if self.max_bytes is not None and total > self.max_bytes:
            raise CacheFull(f"flow cache: {total} bytes would pass its {self.max_bytes} limit")
        self.held = total
        self.peak = max(self.peak, total)


@dataclass(frozen=True)
class Span:
    """One pass at one rate: new positions start..end (absolute, from the prompt's start);
    the first `keep` of them stay for later passes (they end on a chunk edge)."""

    start: int
    end: int
    keep: int

    def __post_init__(self) -> None:
        if not 0 <= self.keep <= self.end - self.start:
            raise ValueError(f"span: keep {self.keep} outside 0..{self.end - self.start}")

    @property
    def length(self) -> int:
        return self.end - self.start

    def scaled(self, factor: int) -> Span:
        """The same span at `factor` times the rate (tokens -> mel frames)."""
        return Span(factor * self.start, factor * self.end, factor * self.keep)


def visible_keys(span: Span, chunk: int, *, device: torch.device) -> Tensor | None:
    """(n, end) bool: new query i sees keys < (i // chunk + 1) * chunk; None for chunk 0 (full
    attention). The same rows `flow_encoder.chunk_mask` gives these queries, keys past `end`
    left off (they are masked for every query here)."""
    if chunk <= 0:
        return None
    query = torch.arange(span.start, span.end, device=device)
    chunk_end = (torch.div(query, chunk, rounding_mode="floor") + 1) * chunk
    return torch.arange(span.end, device=device).unsqueeze(0) < chunk_end.unsqueeze(1)


def key_limits(span: Span, chunk: int) -> KeyLimits | None:
    """`visible_keys` as runs of rows (one per chunk the new queries fall in) that each see a
    prefix of the keys: what the estimator's attention fills cheaply."""
    if chunk <= 0:
        return None
    runs = []
    row = span.start
    while row < span.end:
        chunk_end = (row // chunk + 1) * chunk
        stop = min(span.end, chunk_end)
        runs.append((row - span.start, stop - span.start, min(chunk_end, span.end)))
        row = stop
    return KeyLimits(tuple(runs), span.end)


Segment = tuple[Tensor, Tensor]  # keys and values (B, H, T, d) of consecutive positions


class KeyValues:
    """One attention's keys and values (B, H, T, d) for the positions kept so far: the kept
    positions of the stream this was forked from (read only, shared, never copied), then its
    own buffers."""

    def __init__(self, budget: CacheBudget) -> None:
        self.budget = budget
        self.shared: tuple[Segment, ...] = ()  # the forked-from stream's kept positions
        self.keys: Tensor | None = None  # own (B, H, capacity, d); positions >= length unused
        self.values: Tensor | None = None
        self.length = 0  # own kept positions, after the shared ones

    def fork(self, budget: CacheBudget) -> KeyValues:
        """A copy going on from these kept positions: it reads them where they are (this one
        only ever writes past its own `length`) and keeps its own positions apart."""
        copy = KeyValues(budget)
        copy.shared = self.kept()
        return copy

    def kept(self) -> tuple[Segment, ...]:
        """Every kept position, as segments in order (views, no copy)."""
        if self.keys is None or self.values is None or self.length == 0:
            return self.shared
        return (*self.shared, (self.keys[:, :, : self.length], self.values[:, :, : self.length]))

    def extend_segments(self, keys: Tensor, values: Tensor, keep: int) -> list[Segment]:
        """New keys/values (B, H, n, d) -> every position's, as segments in order (views); the
        first `keep` new positions stay (the rest are overwritten by the next pass)."""
        if self.shared and not reads_segments(keys):
            self._take_in_shared(keys, values)  # joined once, not at every pass
        need = self.length + keys.size(2)
        key_buffer, value_buffer = self._buffers(keys, values, need)
        key_buffer[:, :, self.length : need] = keys
        value_buffer[:, :, self.length : need] = values
        self.length += keep
        return [*self.shared, (key_buffer[:, :, :need], value_buffer[:, :, :need])]

    def extend(self, keys: Tensor, values: Tensor, keep: int) -> tuple[Tensor, Tensor]:
        """`extend_segments` joined into one (B, H, all, d) pair (a copy when forked)."""
        segments = self.extend_segments(keys, values, keep)
        if len(segments) == 1:
            return segments[0]
        return torch.cat([k for k, _ in segments], 2), torch.cat([v for _, v in segments], 2)

    def _take_in_shared(self, keys: Tensor, values: Tensor) -> None:
        """Copy the shared positions into own buffers (before any own position: a fork's
        first write), for an attention that would otherwise join them at every pass."""
        if self.keys is not None:
            raise RuntimeError("flow stream: shared keys taken in after own positions")
        shared, self.shared = self.shared, ()
        self.length = sum(k.size(2) for k, _ in shared)
        need = self.length + keys.size(2)
        try:  # room to grow, as the shared buffer would have got
            grown = max(need, int(GROWTH * self.length))
            key_buffer, value_buffer = self._buffers(keys, values, grown)
        except CacheFull:
            key_buffer, value_buffer = self._buffers(keys, values, need)
        start = 0
        for shared_keys, shared_values in shared:
            stop = start + shared_keys.size(2)
            key_buffer[:, :, start:stop] = shared_keys
            value_buffer[:, :, start:stop] = shared_values
            start = stop

    def _buffers(self, keys: Tensor, values: Tensor, need: int) -> tuple[Tensor, Tensor]:
        """The own buffers, reallocated (x GROWTH, kept positions copied) when `need` exceeds
        them; just `need` when the growth would pass the budget, CacheFull when even that
        would."""
        if self.keys is not None and self.values is not None and need <= self.keys.size(2):
            return self.keys, self.values
        capacity = need if self.keys is None else max(need, int(GROWTH * self.keys.size(2)))
        batch, heads, _, dim = keys.shape
        per_position = batch * heads * (dim + values.size(-1)) * keys.element_size()
        try:
            self.budget.replace(self.nbytes, per_position * capacity)
        except CacheFull:
            capacity = need
            self.budget.replace(self.nbytes, per_position * capacity)
        new_keys = keys.new_empty(batch, heads, capacity, dim)
        new_values = values.new_empty(batch, heads, capacity, values.size(-1))
        if self.keys is not None and self.values is not None:
            new_keys[:, :, : self.length] = self.keys[:, :, : self.length]
            new_values[:, :, : self.length] = self.values[:, :, : self.length]
        self.keys, self.values = new_keys, new_values
        return new_keys, new_values

    @property
    def nbytes(self) -> int:
        """Bytes of the buffers this owns (the shared ones count for the stream they are of)."""
        if self.keys is None or self.values is None:
            return 0
        return self.keys.nbytes + self.values.nbytes


class LayerCache:
    """Per module of one network: a causal conv's last inputs, an attention's keys/values."""

    def __init__(self, budget: CacheBudget) -> None:
        self.budget = budget
        self._tails: dict[nn.Module, Tensor] = {}
        self._attention: dict[nn.Module, KeyValues] = {}

    def fork(self, budget: CacheBudget) -> LayerCache:
        """A copy for another request going on from the same positions: the tails and the kept
        keys/values are shared (never written in place), new positions go to its own buffers."""
        copy = LayerCache(budget)
        copy._tails = dict(self._tails)
        copy._attention = {module: kv.fork(budget) for module, kv in self._attention.items()}
        budget.replace(0, sum(tail.nbytes for tail in copy._tails.values()))
        return copy

    def conv(self, conv: nn.Conv1d, x: Tensor, keep: int) -> Tensor:
        """Causal `conv` (stride 1, no padding of its own, left context kernel-1) on new inputs
        x (B, C_in, n) -> (B, C_out, n); keeps the kernel-1 inputs before position `keep`."""
        width = conv.kernel_size[0] - 1
        tail = self._tails.get(conv)
        if tail is None:
            tail = x.new_zeros(x.size(0), x.size(1), width)
            self.budget.replace(0, tail.nbytes)
        full = torch.cat([tail, x], dim=2)  # (B, C_in, width + n): index j is position j-width
        self._tails[conv] = full[:, :, keep : keep + width].clone()
        return conv1d(conv, full)

    def keys_values(
        self, attention: nn.Module, keys: Tensor, values: Tensor, keep: int
    ) -> tuple[Tensor, Tensor]:
        """`KeyValues.extend` of `attention`'s buffers (one joined pair)."""
        return self._keys_values(attention).extend(keys, values, keep)

    def key_value_segments(
        self, attention: nn.Module, keys: Tensor, values: Tensor, keep: int
    ) -> list[Segment]:
        """`KeyValues.extend_segments` of `attention`'s buffers (shared ones not copied)."""
        return self._keys_values(attention).extend_segments(keys, values, keep)

    def _keys_values(self, attention: nn.Module) -> KeyValues:
        cache = self._attention.get(attention)
        if cache is None:
            cache = self._attention[attention] = KeyValues(self.budget)
        return cache

    @property
    def nbytes(self) -> int:
        tails = sum(tail.nbytes for tail in self._tails.values())
        return tails + sum(kv.nbytes for kv in self._attention.values())
