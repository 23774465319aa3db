"""Per-voice primed flow streams: the prompt's share of a streamed piece's first flow pass, once.

A streamed piece's first hop runs the flow over the prompt's frames and then its own. With
chunk masks, the prompt's positions before its last full chunk (`FlowStreamCache.voice_edge`)
depend on the voice alone, so `VoicePrefixes` keeps one primed `FlowStreamCache` per voice
(keyed by a digest of the prompt's tokens, mel and embedding) and hands each piece a `fork`
of it: the piece's first hop then costs only its own frames. Least recently used voices go
first when a new one would take the store past `max_bytes` (full model in fp32: ~4.6 MB per
prompt mel frame, ~0.23 GB per prompt second); a voice bigger than the whole store is not
kept (its pieces prime their own stream, as before). One store per loaded flow, per process.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from workers.engine.api import VoicePrompt
from workers.model.flow.stream import FlowStreamCache
from workers.model.flow.stream_layers import CacheFull


@dataclass(frozen=True)
class PrefixUse:
    """What one piece's stream got from the store: a hit, or what priming cost."""

    hit: bool
    prime_s: float  # seconds this piece spent priming (0 on a hit)
    prefix_tokens: int  # prompt tokens the piece did not compute
    prefix_bytes: int  # the voice's primed cache (0 when it was not kept)


def voice_key(prompt: VoicePrompt) -> str:
    """A digest of everything the primed prefix depends on besides the model."""
    digest = hashlib.sha256()
    for array in (prompt.speech_tokens, prompt.mel, prompt.embedding):
        digest.update(str(array.dtype).encode() + str(array.shape).encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


class VoicePrefixes:
    """An LRU store of primed flow streams, bounded in bytes; safe to share between threads."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("voice prefixes: max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._primed: OrderedDict[str, FlowStreamCache] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @property
    def held_bytes(self) -> int:
        with self._lock:
            return sum(primed.nbytes for primed in self._primed.values())

    def __len__(self) -> int:
        return len(self._primed)

    @torch.inference_mode()
    def stream(
        self, prompt: VoicePrompt, fresh: Callable[[], FlowStreamCache], *, max_bytes: int | None
    ) -> tuple[FlowStreamCache, PrefixUse]:
        """A piece's stream: a fork of the voice's primed one, else `fresh()` (a new stream of
        this prompt under the piece's `max_bytes`) primed, and kept for the voice's later pieces
        when it fits in the store (the piece then goes on in a fork of it)."""
        key = voice_key(prompt)
        with self._lock:
            primed = self._primed.get(key)
            if primed is not None:
                self._primed.move_to_end(key)
                self.hits += 1
            else:
                self.misses += 1
        if primed is not None:
            piece = primed.fork(max_bytes=max_bytes)
            return piece, PrefixUse(True, 0.0, primed.kept, primed.nbytes)
        start = time.perf_counter()
        stream = fresh()
        try:
            tokens = stream.prime()
        except CacheFull:  # the piece's own limit: it starts over and will recompute
            return fresh(), PrefixUse(False, time.perf_counter() - start, 0, 0)
        spent = time.perf_counter() - start
        if tokens == 0 or stream.nbytes > self.max_bytes:
            return stream, PrefixUse(False, spent, tokens, 0)
        self._keep(key, stream)
        return stream.fork(max_bytes=max_bytes), PrefixUse(False, spent, tokens, stream.nbytes)

    def _keep(self, key: str, primed: FlowStreamCache) -> None:
        """Store `primed`, dropping least recently used voices until the store fits."""
        with self._lock:
            self._primed[key] = primed
            self._primed.move_to_end(key)
            while sum(p.nbytes for p in self._primed.values()) > self.max_bytes:
                self._primed.popitem(last=False)
