"""What a `PipelineBatchSession` needs of its pipeline and of its LLM's row decoder.

Protocols only, so the session and the tests' scripted doubles (tests/doubles/stepped.py) meet
on one definition; `SynthesisPipeline` and `BatchDecoder` / `OrtBatchDecoder` (both a
`RowBatch`) are the production sides.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

import numpy as np
import torch

from workers.engine.api import SynthesisInput, SynthesisOutput
from workers.engine.requests import RequestPlan
from workers.engine.stages import FlowStage, VocoderStage
from workers.model.llm.batch import FinishedRow


class PlannedPipeline(Protocol):
    """What the session needs of `SynthesisPipeline` (which imports this module)."""

    sample_rate: int
    flow: FlowStage
    vocoder: VocoderStage

    @property
    def forced_speech_tokens(self) -> int | None: ...

    def begin(self, request: SynthesisInput) -> RequestPlan: ...

    def piece_audio(
        self, ids: np.ndarray, plan: RequestPlan, mel: np.ndarray | None = None
    ) -> np.ndarray: ...

    def piece_mel(
        self, ids: np.ndarray, plan: RequestPlan, mel: np.ndarray | None = None
    ) -> np.ndarray | None: ...

    def finish(self, audio: list[np.ndarray], plan: RequestPlan) -> np.ndarray: ...

    def synthesize_planned(self, plan: RequestPlan) -> SynthesisOutput: ...


class KeyedRow(Protocol):
    @property
    def key(self) -> Hashable: ...


class RowDecoder(Protocol):
    """What the session needs of `BatchDecoder`: rows join between steps, one step advances
    them all and returns those that finished, a row leaves early, or all rows at once."""

    @property
    def rows(self) -> Sequence[KeyedRow]: ...

    def add(
        self,
        key: Hashable,
        text: Sequence[int],
        *,
        prompt_text: Sequence[int],
        prompt_speech: np.ndarray,
        generator: torch.Generator,
        forced_length: int | None = None,
    ) -> None:
        """Validate and prefill one piece; RowTooLong when it fits alone but not in a row."""

    def step(self) -> list[FinishedRow]: ...

    def drop(self, key: Hashable) -> bool: ...

    def clear(self) -> None: ...
