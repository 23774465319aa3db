"""The requests a `PipelineBatchSession` holds: a job (one request, at most one LLM row), a
task ahead of the rows, and the helpers that read a finished row's job and plan."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workers.engine.api import SynthesisInput, SynthesisOutput
from workers.engine.requests import RequestPlan
from workers.model.llm.batch import FinishedRow
from workers.model.llm.cosyvoice3 import cap_silent_runs


@dataclass(eq=False)
class FirstTask:
    """A task for the model thread ahead of the rows (`run_first`)."""

    task: Callable[[], Any]
    future: Future[Any]


@dataclass(eq=False)  # identity: a job is the key of its LLM row
class Job:
    request: SynthesisInput
    future: Future[SynthesisOutput]
    plan: RequestPlan | None = None
    error: BaseException | None = None  # its front end's, raised on the preparation thread
    audio: list[np.ndarray] = field(default_factory=list)
    batch_size: int = 1
    alone: bool = False  # run (or waiting to run) beside the batch: it holds no row


def capped(row: FinishedRow, llm: object) -> FinishedRow:
    """The row's tokens as the alone path hands them on: CosyVoice 3's silent-run cap
    (`cap_silent_runs`; nothing changes for CosyVoice 2, which has no silent tokens)."""
    config = getattr(getattr(llm, "model", None), "config", None)
    if config is None or not getattr(config, "silent_tokens", ()):
        return row
    return dataclasses.replace(row, tokens=list(cap_silent_runs(row.tokens, config)))


def job_of(row: FinishedRow) -> Job:
    assert isinstance(row.key, Job)
    return row.key


def plan_of(job: Job) -> RequestPlan:
    assert job.plan is not None
    return job.plan


def output_of(job: Job, samples: np.ndarray, sample_rate: int) -> SynthesisOutput:
    """The finished job's output: its samples, with its plan's counters and stage seconds."""
    state = plan_of(job).state
    return SynthesisOutput(
        samples=samples,
        sample_rate=sample_rate,
        stage_seconds=dict(state.clock.seconds),
        speech_tokens=state.speech_tokens,
        batch_size=job.batch_size,
        pieces=list(state.spans),
        text_tokens=state.text_tokens,
        seed=state.seed,
    )
