"""A piece's streamed flow behind `streaming.FlowChunks`: incremental, or recomputed per hop.

`CachedFlowChunks` runs our torch flow's `FlowStreamCache` (each hop computes only its own
frames); `RecomputedFlowChunks` re-runs a whole-prefix `mel_chunk` every hop, as upstream does
(kept for parity checks of the cache, and for a flow object that has no cache).
`BoundedFlowChunks` runs the cache until it holds more than its byte limit, then drops it and
recomputes the rest of the piece (the two agree within 1e-5, so the switch is inaudible; only
the cost per hop changes). All are created per piece, so nothing of a request stays on the
shared flow.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
import torch

from workers.engine.api import VoicePrompt
from workers.model.flow import CausalMaskedDiffWithXvec
from workers.model.flow_stream import FlowStreamCache


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
    """Our torch flow's incremental stream (`FlowStreamCache`), numpy in and out."""

    def __init__(
        self, model: CausalMaskedDiffWithXvec, prompt: VoicePrompt, device: torch.device
    ) -> None:
        self.device = device
        with torch.inference_mode():
            self.cache = FlowStreamCache(
                model,
                _tensor(prompt.speech_tokens.astype(np.int32), device),
                _tensor(prompt.mel, device),
                _tensor(prompt.embedding, device),
            )

    @torch.inference_mode()
    def mel(self, tokens: np.ndarray, *, finalize: bool) -> np.ndarray:
        ids = _tensor(np.asarray(tokens, dtype=np.int32), self.device)
        return self.cache.advance(ids, finalize=finalize)[0].cpu().numpy()


def _tensor(array: Any, device: torch.device) -> torch.Tensor:
    """A numpy array as a (1, ...) tensor on `device`."""
    return torch.from_numpy(np.ascontiguousarray(array))[None].to(device)


class BoundedFlowChunks:
    """The cached stream while its cache holds at most `max_bytes`, then the recompute path
    (the full model's cache takes ~4.6 MB per mel frame, so a long piece would otherwise hold
    gigabytes); `switched_at` is the token count at the switch (None: never)."""

    def __init__(self, cached: CachedFlowChunks, fallback: RecomputedFlowChunks, max_bytes: int):
        self.cached: CachedFlowChunks | None = cached
        self.fallback = fallback
        self.max_bytes = max_bytes
        self.switched_at: int | None = None
        self._given: list[np.ndarray] = []

    def mel(self, tokens: np.ndarray, *, finalize: bool) -> np.ndarray:
        if self.cached is None:
            return self.fallback.mel(tokens, finalize=finalize)
        tokens = np.asarray(tokens, dtype=np.int32)
        self._given.append(tokens)
        mel = self.cached.mel(tokens, finalize=finalize)
        if not finalize and self.cached.cache.nbytes > self.max_bytes:
            self._switch()
        return mel

    def _switch(self) -> None:
        """Hand the tokens so far to the recompute path, as if it had made these frames."""
        given = np.concatenate(self._given)
        self.fallback.tokens = given
        self.fallback.offset = given.size - self.fallback.flow.lookahead
        self.switched_at = int(given.size)
        self.cached, self._given = None, []  # the cache's memory goes now
