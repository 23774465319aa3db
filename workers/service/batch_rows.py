"""A batch window's rows: one admitted job each, the events about them, the model's busy time.

Each row's store is claimed under its lock: the window's thread expires a row only while no
store has begun, and the I/O pool stores a row only while it has not expired, so a row past
its deadline never writes at the key its retry now owns. The claim is taken the moment the
model is done with the row: a row the model finished in time is never judged late.
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from workers import tasks
from workers.engine.api import StopCheck, SynthesisOutput
from workers.service.attempts import Attempt


@dataclass(eq=False)
class BatchJob:
    """One admitted job: its attempt, deadline and where it is in the pipeline."""

    attempt: Attempt
    deadline: float = math.inf
    prepared: tasks.PreparedSynthesis | None = None
    future: Future[SynthesisOutput] | None = None
    done: bool = False  # outcome recorded (or timed out): later events about it are dropped
    expired: bool = False  # failed as timed out: its audio must not be stored
    storing: bool = False  # the model is done with it, its store is next: never expired now
    streamed: bool = False  # run ahead of the rows (workers/service/streamed_first.py)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def job_id(self) -> str:
        return self.attempt.job.id

    def claim_store(self) -> bool:
        """When the model is done with the row: False when it has expired meanwhile."""
        with self._lock:
            if self.expired:
                return False
            self.storing = True
            return True

    def stop_check(self, canceled: StopCheck | None) -> StopCheck:
        """The row's `should_stop`: canceled, or expired (failed as timed out by the window).
        The session drops an expired row at its next step (the alone lane stops it at its next
        LLM step), so a job past its deadline no longer decodes on to its end for nothing."""

        def stop() -> bool:
            return self.expired or (canceled is not None and canceled())

        return stop

    def expire(self) -> bool:
        """On the window's thread: False when the row is already being stored."""
        with self._lock:
            if self.storing:
                return False
            self.expired = True
            return True


@dataclass(frozen=True)
class Event:
    """From the model thread or the I/O pool to the window's thread."""

    kind: str  # prepared, finished, failed
    job: BatchJob
    value: Any = None  # PreparedSynthesis, the result dict, or exc_info


@dataclass
class BusyClock:
    """Time during which the model had at least one request: the bench's idle share."""

    busy_s: float = 0.0
    _active: int = 0
    _since: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self) -> None:
        with self._lock:
            if self._active == 0:
                self._since = time.perf_counter()
            self._active += 1

    def leave(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self.busy_s += time.perf_counter() - self._since

    def snapshot(self) -> float:
        with self._lock:
            extra = time.perf_counter() - self._since if self._active else 0.0
            return self.busy_s + extra
