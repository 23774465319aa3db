"""The batching test engine: the real `PipelineBatchSession` driven by a scripted model step.

So the thread protocol the service's batch tests exercise (submit, futures, admission between
steps, cancel, close, a request's own error on its own future) is the production one, only
the model is scripted:
- `ScriptedPipeline` is the session's `PlannedPipeline`: its front end (`begin`) obeys the
  text's directives and renders the samples `ScriptedEngine` gives the request alone, as one
  piece of `decode_steps` ids; once those are decoded, the piece's audio is those samples, so
  batching cannot change them;
- `SteppedDecoder` is the session's `RowDecoder`: every step takes `step_s` however many rows
  share it (as a batched forward reads the weights once for all rows), advances each row by
  one of its piece's ids, and reports for each finished row the most rows that shared a step
  with it; with `row_steps` set, a piece of more steps is too long for a row (`RowTooLong`:
  its request runs alone).
Alone (`synthesize`) the same plan decodes its steps one after another, each after asking
`should_stop`, as the real engine's LLM loop does.
"""

from __future__ import annotations

import dataclasses
import os
import time
import zlib
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

import numpy as np
import torch

from tests.doubles.engines import SAMPLE_RATE, TONE_HZ, ScriptedEngine
from workers.engine.api import SynthesisInput, SynthesisOutput, VoicePrompt, stop_if_asked
from workers.engine.batch_session import PipelineBatchSession
from workers.engine.modes import LLMPrompt
from workers.engine.requests import RequestPlan, RequestState
from workers.engine.stages import FlowStage, VocoderStage
from workers.engine.text_frontend import TextPiece
from workers.model.llm.batch import FinishedRow, RowTooLong


def decode_steps(output: SynthesisOutput) -> int:
    """The steps a request's piece takes to decode: one per 4 speech tokens, at least one."""
    return max(1, output.speech_tokens // 4)


@dataclass
class ScriptedPlan(RequestPlan):
    """A request after the scripted front end, with what it gets alone (decode time aside)."""

    output: SynthesisOutput


class Unbatched:
    """The flow and vocoder the session sees: neither batches, so the session hands each
    finished piece to `piece_audio`, which has its samples already; never called."""

    name = "scripted"

    def mel(self, tokens: np.ndarray, prompt: VoicePrompt) -> NoReturn:
        raise RuntimeError("the scripted pipeline renders its samples in its front end")

    def waveform(self, mel: np.ndarray, generator: torch.Generator) -> NoReturn:
        raise RuntimeError("the scripted pipeline renders its samples in its front end")


class ScriptedPipeline:
    """The `PlannedPipeline` behind BatchingScriptedEngine, alone and in the batch session."""

    forced_speech_tokens: int | None = None

    def __init__(self, engine: BatchingScriptedEngine) -> None:
        self.engine = engine
        self.sample_rate = SAMPLE_RATE
        self.flow: FlowStage = Unbatched()
        self.vocoder: VocoderStage = Unbatched()

    def begin(self, request: SynthesisInput) -> ScriptedPlan:
        """The directives run here (a sleep, a fault, a refusal: the request's own error), and
        the samples are drawn with the seed the output reports."""
        state = RequestState.start(request.seed)
        with state.clock.timed("frontend"):
            output = self.engine.render(dataclasses.replace(request, seed=state.seed))
        piece = TextPiece(request.text, tuple(range(decode_steps(output))))
        prompt = LLMPrompt(text_ids=[], speech_tokens=np.zeros(0, dtype=np.int32))
        return ScriptedPlan(request, state, [piece], prompt, output)

    def piece_audio(
        self, ids: np.ndarray, plan: RequestPlan, mel: np.ndarray | None = None
    ) -> np.ndarray:
        """The one piece's samples, once its ids are decoded."""
        return _scripted(plan).output.samples

    def piece_mel(
        self, ids: np.ndarray, plan: RequestPlan, mel: np.ndarray | None = None
    ) -> NoReturn:
        raise RuntimeError("only a vocoder that batches asks for mels; this one does not")

    def finish(self, audio: list[np.ndarray], plan: RequestPlan) -> np.ndarray:
        """The samples, with the speech tokens and spans the request reports alone."""
        output = _scripted(plan).output
        plan.state.speech_tokens = output.speech_tokens
        plan.state.spans = list(output.pieces)
        with plan.state.clock.timed("join"):
            return np.concatenate(audio)

    def synthesize_planned(self, plan: RequestPlan) -> SynthesisOutput:
        """Alone: the piece's steps one after another, each after asking `should_stop`."""
        state = plan.state
        for _ in plan.pieces[0].ids:
            stop_if_asked(plan.request.should_stop)
            with state.clock.timed("llm"):
                time.sleep(self.engine.step_s)
        samples = self.finish([self.piece_audio(np.zeros(0, np.int32), plan)], plan)
        return dataclasses.replace(
            _scripted(plan).output,
            samples=samples,
            stage_seconds=dict(state.clock.seconds),
            seed=state.seed,
        )


def _scripted(plan: RequestPlan) -> ScriptedPlan:
    assert isinstance(plan, ScriptedPlan)  # the session hands back the plans `begin` made
    return plan


@dataclass(eq=False)
class SteppedRow:
    key: Hashable
    script: tuple[int, ...]  # the piece's ids, played back as its speech tokens
    tokens: list[int] = field(default_factory=list)
    shared: int = 0  # the most rows in any step it took part in


class SteppedDecoder:
    """The session's `RowDecoder` in the tests: `rows` rows at most, one step per `step_s`."""

    def __init__(self, rows: int, step_s: float, row_steps: int | None = None) -> None:
        self.capacity = rows
        self.step_s = step_s
        self.row_steps = row_steps  # a piece of more steps is too long for a row (runs alone)
        self.rows: list[SteppedRow] = []

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
        if self.row_steps is not None and len(text) > self.row_steps:
            raise RowTooLong(f"{len(text)} steps > {self.row_steps} per batch row")
        if len(self.rows) >= self.capacity:
            raise ValueError("no free row in the batch")
        self.rows.append(SteppedRow(key, tuple(text)))

    def step(self) -> list[FinishedRow]:
        """One batched step: the same `step_s` for one row or many."""
        time.sleep(self.step_s)
        for row in self.rows:
            row.tokens.append(row.script[len(row.tokens)])
            row.shared = max(row.shared, len(self.rows))
        finished = [row for row in self.rows if len(row.tokens) >= len(row.script)]
        self.rows = [row for row in self.rows if len(row.tokens) < len(row.script)]
        return [FinishedRow(row.key, row.tokens, row.shared) for row in finished]

    def drop(self, key: Hashable) -> bool:
        kept = [row for row in self.rows if row.key is not key]
        dropped = len(kept) < len(self.rows)
        self.rows = kept
        return dropped

    def clear(self) -> None:
        self.rows.clear()


class BatchingScriptedEngine(ScriptedEngine):
    """ScriptedEngine whose tone depends on text and seed, batched by the real session."""

    def __init__(self, *, name: str = "test-batching") -> None:
        super().__init__(name=name)
        # read when the engine loads, not at import: a worker forked from the test template
        # (tests/doubles/harness.py) has its own environment, the template imported with its own
        self.step_s = float(os.environ.get("TESTENGINE_STEP_S", "0.02"))
        self.row_steps: int | None = None  # set: longer pieces are too long for a row
        self.pipeline = ScriptedPipeline(self)

    def synthesize(self, request: SynthesisInput) -> SynthesisOutput:
        return self.pipeline.synthesize_planned(self.pipeline.begin(request))

    def render(self, request: SynthesisInput) -> SynthesisOutput:
        """The directives and the samples, without the decode time."""
        output = super().synthesize(request)
        hz = TONE_HZ + zlib.crc32(request.text.encode()) % 200 + (request.seed or 0) % 50
        t = np.arange(output.samples.shape[0], dtype=np.float32) / SAMPLE_RATE
        output.samples = (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)
        return output

    def open_batch_session(self, max_batch: int) -> PipelineBatchSession:
        decoder = SteppedDecoder(max_batch, self.step_s, self.row_steps)
        return PipelineBatchSession(self.pipeline, decoder, max_batch)
