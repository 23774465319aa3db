"""A piece's streamed flow behind `streaming.FlowChunks`: incremental, or recomputed per hop.

`CachedFlowChunks` runs our torch flow's `FlowStreamCache` (each hop computes only its own
frames); `RecomputedFlowChunks` re-runs a whole-prefix `mel_chunk` every hop, as upstream does
(kept for parity checks of the cache, and for a flow object that has no cache).
`BoundedFlowChunks` runs the cache until a hop would need more than its byte limit (checked
before any buffer grows, so the cache never holds more), then drops it and recomputes that
hop and the rest of the piece (the two agree within 1e-5, so the switch is inaudible; only
the cost per hop changes). All are created per piece, so nothing of a request stays on the
shared flow.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from workers.engine.api import VoicePrompt
from workers.engine.voice_prefixes import PrefixUse, VoicePrefixes
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.model.flow.stream import FlowStreamCache
from workers.model.flow.stream_layers import CacheFull


class PrefixFlow(Protocol):
    """A flow that computes a streamed chunk's mel from every token so far."""

    @property
    def lookahead(self) -> int: ...

    def mel_chunk(
        self, tokens: np.ndarray, prompt: VoicePrompt, *, offset: int, finalize: bool
    ) -> np.ndarray:
        """tokens (n,) so far -> mel (80, frames) for tokens offset.. (look-ahead excluded
        unless finalize)."""


class RecomputedFlowChunks:
    """Keeps the piece's tokens and asks for the mel after the frames already given."""

    def __init__(self, flow: PrefixFlow, prompt: VoicePrompt) -> None:
        self.flow = flow
        self.prompt = prompt
        self.tokens = np.zeros(0, dtype=np.int32)
        self.offset = 0  # tokens whose frames were returned

    def mel(self, tokens: np.ndarray, *, finalize: bool) -> np.ndarray:
        self.tokens = np.concatenate([self.tokens, np.asarray(tokens, dtype=np.int32)])
        offset = self.offset
        self.offset = self.tokens.size - (0 if finalize else self.flow.lookahead)
        return self.flow.mel_chunk(self.tokens, self.prompt, offset=offset, finalize=finalize)


class CachedFlowChunks:
    """Our torch flow's incremental stream (`FlowStreamCache`), numpy in and out; with
    `max_bytes` a hop that would need more raises CacheFull."""

    def __init__(
        self,
        model: CausalMaskedDiffWithXvec,
        prompt: VoicePrompt,
        device: torch.device,
        *,
        max_bytes: int | None = None,
        prefixes: VoicePrefixes | None = None,
    ) -> None:
        self.device = device

        def fresh() -> FlowStreamCache:
            return FlowStreamCache(
                model,
                _tensor(prompt.speech_tokens.astype(np.int32), device),
                _tensor(prompt.mel, device),
                _tensor(prompt.embedding, device),
                max_bytes=max_bytes,
            )

        self.prefix_use: PrefixUse | None = None  # None: no voice store
        with torch.inference_mode():
            if prefixes is None:
                self.cache = fresh()
            else:
                self.cache, self.prefix_use = prefixes.stream(prompt, fresh, max_bytes=max_bytes)

    @torch.inference_mode()
    def mel(self, tokens: np.ndarray, *, finalize: bool) -> np.ndarray:
        ids = _tensor(np.asarray(tokens, dtype=np.int32), self.device)
        return self.cache.advance(ids, finalize=finalize)[0].cpu().numpy()


def _tensor(array: Any, device: torch.device) -> torch.Tensor:
    """A numpy array as a (1, ...) tensor on `device`."""
    return torch.from_numpy(np.ascontiguousarray(array))[None].to(device)


class BoundedFlowChunks:
    """The cached stream (built with `max_bytes`) while its hops fit, then the recompute path
    (the full model's cache takes ~4.6 MB per mel frame, so a long piece would otherwise hold
    gigabytes); `switched_at` is the token count before the hop that did not fit (None:
    never), `peak_bytes` the most the cache held."""

    def __init__(self, cached: CachedFlowChunks, fallback: RecomputedFlowChunks):
        self.cached: CachedFlowChunks | None = cached
        self.fallback = fallback
        self.switched_at: int | None = None
        self.peak_bytes = 0
        self.prefix_use = cached.prefix_use
        self._given: list[np.ndarray] = []

    def mel(self, tokens: np.ndarray, *, finalize: bool) -> np.ndarray:
        if self.cached is None:
            return self.fallback.mel(tokens, finalize=finalize)
        tokens = np.asarray(tokens, dtype=np.int32)
        try:
            mel = self.cached.mel(tokens, finalize=finalize)
        except CacheFull:
            self._switch()
            return self.fallback.mel(tokens, finalize=finalize)
        finally:
            if self.cached is not None:
                self.peak_bytes = max(self.peak_bytes, self.cached.cache.budget.peak)
        self._given.append(tokens)
        return mel

    def _switch(self) -> None:
        """Hand the tokens of the hops the cache made to the recompute path, as if it had made
        their frames; the cache (left half-way through a pass) is dropped."""
        given = np.concatenate(self._given) if self._given else np.zeros(0, dtype=np.int32)
        self.fallback.tokens = given
        self.fallback.offset = given.size - self.fallback.flow.lookahead if self._given else 0
        self.switched_at = int(given.size)
        self.cached, self._given = None, []  # the cache's memory goes now
