"""One request's mutable state and plan, created per call and never kept on the engine.

Shared by the alone path (`pipeline`) and the batch session (`batch_session`), so both count
stage seconds, pieces and tokens the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch

from workers.engine.api import PieceSpan, SynthesisInput
from workers.engine.modes import LLMPrompt
from workers.engine.quality import tail_repetition
from workers.engine.text_frontend import TextPiece

STAGES = ("frontend", "llm", "flow", "hift", "join")


class StageClock:
    """Seconds spent per stage, summed over the pieces of one request. Where CUDA is in use a
    stage's time ends when the GPU has finished its work (kernels run asynchronously: without
    the synchronisation the flow's time would show up in HiFT's); the CPU is untouched."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(STAGES, 0.0)

    @contextlib.contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if torch.cuda.is_initialized():
                torch.cuda.synchronize()
            self.seconds[stage] += time.perf_counter() - start


def fresh_seed() -> int:
    """A random seed in the contract's range 0..2**32-1."""
    return int.from_bytes(os.urandom(4), "little")


@dataclass
class RequestState:
    """One request's mutable state: created per call, never kept on the engine."""

    seed: int
    generator: torch.Generator
    clock: StageClock = field(default_factory=StageClock)
    pieces: int = 0
    speech_tokens: int = 0
    llm_first_token_s: float = 0.0  # summed over pieces: prefill + first sampling step
    text_tokens: int = 0  # TTS text tokens over all pieces (the length estimate's input)
    spans: list[PieceSpan] = field(default_factory=list)  # per piece, in order

    def record_stop(self, ids: np.ndarray | list[int], stop: str) -> None:
        """How the LLM ended the next piece (its text and place are set by the join)."""
        self.spans.append(PieceSpan("", 0, 0, len(ids), stop, tail_repetition(ids)))

    def place_pieces(self, texts: list[str], bounds: list[tuple[int, int]]) -> None:
        """Each piece's text and [start, end) samples in the joined output, beside how its
        decoding ended (a piece whose stop was not recorded keeps "unknown")."""
        stops = self.spans + [PieceSpan("", 0, 0)] * (len(texts) - len(self.spans))
        self.spans = [
            dataclasses.replace(stop, text=text, start=start, end=end)
            for stop, text, (start, end) in zip(stops, texts, bounds, strict=False)
        ]

    @classmethod
    def start(cls, seed: int | None) -> RequestState:
        seed = fresh_seed() if seed is None else seed
        return cls(seed=seed, generator=torch.Generator(device="cpu").manual_seed(seed))


@dataclass
class RequestPlan:
    """One request after its front end: what every piece's stages need."""

    request: SynthesisInput
    state: RequestState
    pieces: list[TextPiece]
    prompt: LLMPrompt
