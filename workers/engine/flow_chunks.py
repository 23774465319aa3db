"""A piece's streamed flow behind `streaming.FlowChunks`: incremental, or recomputed per hop.

`CachedFlowChunks` runs our torch flow's `FlowStreamCache` (each hop computes only its own
frames); `RecomputedFlowChunks` re-runs a whole-prefix `mel_chunk` every hop, as upstream does
(kept for parity checks of the cache, and for a flow object that has no cache). Both are
created per piece, so nothing of a request stays on the shared flow.
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
