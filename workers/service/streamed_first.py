"""A streamed job popped during a batch window: its synthesis on the model thread, first.

`StreamedFirst` is the engine as such a job's `tasks.run_synthesis` sees it. Each synthesis is
one `run_first` task of the window's BatchSession: the rows in flight pause while it runs, so
its first chunk comes about as soon as an idle worker's would (plus at most the step under
way), instead of after the whole window. Its chunks go out from the model thread as they are
made. Once its attempt is past its deadline nothing more of it is written and the model stops
at its next LLM step (its `should_stop` says so): that step, the next chunk, or the store claim
after the model, raises `AttemptDropped`, and the retry owns the stream and
the key (the same rule as a batched row's, workers/service/batch_rows.py). A session whose model
thread has failed takes no task: the job fails retryable (`WorkerModelFailedError`), as it
did nothing wrong, and is retried on another worker.

`run_streamed` runs one such job whole on the window's streamed lane and reports its outcome.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from shared.errors import WorkerModelFailedError
from shared.logs import get_logger
from workers import tasks
from workers.engine.api import (
    ChunkSink,
    ModelIdentity,
    StreamingEngine,
    SynthesisCanceled,
    SynthesisEngine,
    SynthesisInput,
    SynthesisOutput,
    VoicePrompt,
)
from workers.engine.batching import BatchSession, SessionFailed
from workers.service.batch_rows import BatchJob, BusyClock, Event
from workers.service.job_runtime import WorkerRuntime

log = get_logger(__name__)


class AttemptDropped(Exception):
    """The attempt timed out in its window: its audio is dropped, its retry owns the key."""


class StreamedFirst:
    """The worker's engine, each synthesis run by `session.run_first` for one attempt."""

    def __init__(
        self,
        engine: SynthesisEngine,
        session: BatchSession,
        *,
        owned: Callable[[], bool],  # False once the window expired the attempt
        claim_store: Callable[[], bool],  # after the model: False when expired meanwhile
    ) -> None:
        self.engine = engine
        self.session = session
        self.owned = owned
        self.claim_store = claim_store
        self.identity: ModelIdentity = engine.identity
        self.sample_rate: int = engine.sample_rate

    def warm_up(self) -> None:
        """Warmed up with the worker already."""

    def extract_voice(self, samples: np.ndarray, sample_rate: int, transcript: str) -> VoicePrompt:
        return self.engine.extract_voice(samples, sample_rate, transcript)

    def synthesize(self, request: SynthesisInput) -> SynthesisOutput:
        return self.synthesize_streaming(request, lambda samples: None)

    def synthesize_streaming(self, request: SynthesisInput, on_chunk: ChunkSink) -> SynthesisOutput:
        def sink(samples: np.ndarray) -> None:
            if not self.owned():
                raise AttemptDropped("past its deadline: the retry owns its stream")
            on_chunk(samples)

        canceled = request.should_stop

        def stop() -> bool:  # past its deadline, the model stops at its next LLM step too
            return not self.owned() or (canceled is not None and canceled())

        request = dataclasses.replace(request, should_stop=stop)

        def task() -> SynthesisOutput:
            try:
                if isinstance(self.engine, StreamingEngine):
                    return self.engine.synthesize_streaming(request, sink)
                output = self.engine.synthesize(request)  # cannot stream: one chunk
            except SynthesisCanceled:
                if not self.owned():
                    raise AttemptDropped("past its deadline: the retry owns its stream") from None
                raise
            sink(output.samples)
            return output

        try:
            future = self.session.run_first(task)
        except SessionFailed as e:
            raise WorkerModelFailedError() from e
        output = future.result()
        if not self.claim_store():
            raise AttemptDropped("past its deadline: the retry owns its key")
        return output


def run_streamed(
    entry: BatchJob,
    runtime: WorkerRuntime,
    payload: Any,
    context: tasks.JobContext,
    *,
    session: BatchSession | None,
    clock: BusyClock,
    report: Callable[[Event], None],
) -> None:
    """A streamed job whole, as alone, its synthesis one `run_first` task of the session; its
    outcome goes to `report` (the window's events), none for an attempt dropped as late."""
    assert session is not None
    engine = StreamedFirst(
        runtime.engine, session, owned=lambda: not entry.expired, claim_store=entry.claim_store
    )
    clock.enter()
    try:
        result = tasks.run_synthesis(
            dataclasses.replace(runtime, engine=engine),
            payload,
            context,
            owned=lambda: not entry.expired,
        )
    except AttemptDropped:
        log.warning("batch_row_dropped", job_id=entry.job_id, why="past its deadline")
    except BaseException:
        report(Event("failed", entry, sys.exc_info()))
    else:
        report(Event("finished", entry, result.model_dump(mode="json")))
    finally:
        clock.leave()
