"""A batching test engine whose model loop itself fails, as when the device is lost mid-step.

`CrashingDecoder` steps as `SteppedDecoder` until its step number `crash_at` (from 1): that
step sets `stepping`, waits for `go` when one is given (a test places its jobs first), then
raises `DeviceLost`, and so does the session's `clear` after it, so the session's loop itself
fails: every job it held settles with the error, and it takes no more work
(workers/engine/batch_session.py). The worker's tests load it as
`tests.doubles.engines:crashing_batch` (TESTENGINE_CRASH_AT_STEP, default 1).
"""

from __future__ import annotations

import threading

from tests.doubles.stepped import BatchingScriptedEngine, SteppedDecoder
from workers.engine.batch_session import PipelineBatchSession
from workers.model.llm.batch import FinishedRow

WAIT_S = 60  # a bound for a wait that should end at once, never a guess at a race


class DeviceLost(RuntimeError):
    """The model's device gone: its decode step fails, and so does clearing its rows."""


class CrashingDecoder(SteppedDecoder):
    """SteppedDecoder whose step `crash_at` fails, and the `clear` after it."""

    def __init__(
        self,
        rows: int,
        step_s: float,
        *,
        crash_at: int,
        stepping: threading.Event,
        go: threading.Event | None,
    ) -> None:
        super().__init__(rows, step_s)
        self.crash_at = crash_at
        self.stepping = stepping
        self.go = go
        self.steps = 0
        self.cleared_once = False

    def step(self) -> list[FinishedRow]:
        self.steps += 1
        if self.steps < self.crash_at:
            return super().step()
        self.stepping.set()
        if self.go is not None:
            assert self.go.wait(WAIT_S)
        raise DeviceLost("the device is gone")

    def clear(self) -> None:
        """Fails once: the session's rerun of the step's rows alone never begins."""
        if not self.cleared_once:
            self.cleared_once = True
            raise DeviceLost("the device is gone")
        super().clear()


class CrashingBatchEngine(BatchingScriptedEngine):
    """BatchingScriptedEngine over a CrashingDecoder; `stepping` is set once its crash step
    began (its rows are then on the model)."""

    def __init__(self, *, crash_at: int = 1, go: threading.Event | None = None) -> None:
        super().__init__(name="test-crashing")
        self.crash_at = crash_at
        self.go = go
        self.stepping = threading.Event()

    def open_batch_session(self, max_batch: int) -> PipelineBatchSession:
        decoder = CrashingDecoder(
            max_batch, self.step_s, crash_at=self.crash_at, stepping=self.stepping, go=self.go
        )
        return PipelineBatchSession(self.pipeline, decoder, max_batch)
