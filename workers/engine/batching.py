"""The engine's batch interface: many jobs in flight in one worker, each with its own answer.

The worker hands requests to a `BatchSession` as it admits them and gets one future per
request; the session runs the model on its own thread and may join requests that arrive while
others decode (continuous batching). One request's failure is its own future's exception, never
its neighbours'. `open_batch_session` gives the engine's own session when it has one (the
PyTorch pipeline's batched decode loop), else `SequentialSession`, which runs requests one by
one on the model thread: the same contract for engines that cannot batch (test doubles).
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from typing import Any, Protocol, TypeVar, runtime_checkable

from shared.logs import get_logger
from workers.engine.api import SynthesisEngine, SynthesisInput, SynthesisOutput
from workers.engine.openmp_pool import release_thread_team

log = get_logger(__name__)

T = TypeVar("T")
_WAKE = object()  # a queue item that only wakes the model thread for a `run_first` task


class SessionFailed(RuntimeError):
    """The session's model thread failed: it settled what it held and takes no more work."""


class BatchSession(Protocol):
    """Requests in, futures out; `max_batch` requests at most in flight."""

    max_batch: int

    def submit(self, request: SynthesisInput) -> Future[SynthesisOutput]:
        """Queue one request; its output (or exception) arrives on the future."""
        ...

    def run_first(self, task: Callable[[], T]) -> Future[T]:
        """Run `task` on the model thread at the next request or step boundary, ahead of every
        request in flight (they pause meanwhile); its outcome arrives on the future."""
        ...

    def in_flight(self) -> int:
        """Requests and tasks submitted whose futures are not done yet."""
        ...

    def alone(self) -> int:
        """Requests in flight that hold no row (too long for one, or rerun after a failed
        step): they run one at a time beside the batch, which may take others in their place."""
        ...

    def failed(self) -> bool:
        """True once the model thread itself failed: every future it held is settled with its
        error, and `submit` and `run_first` raise `SessionFailed`."""
        ...

    def close(self) -> None:
        """Finish every submitted request, then stop the model thread."""
        ...


@runtime_checkable
class BatchingEngine(Protocol):
    """An engine with its own batched session (continuous batching across requests)."""

    def open_batch_session(self, max_batch: int) -> BatchSession: ...


class SequentialSession:
    """A BatchSession that runs one request at a time on its own model thread."""

    def __init__(self, engine: SynthesisEngine, max_batch: int = 1) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self._queue: queue.Queue[Any] = queue.Queue()  # (request, future), _WAKE or None
        self._first: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._pending = 0
        self._lock = threading.Lock()
        release_thread_team()  # the model moves to its own thread: one OpenMP team
        self._thread = threading.Thread(target=self._loop, name="cosyq-model", daemon=True)
        self._thread.start()

    def submit(self, request: SynthesisInput) -> Future[SynthesisOutput]:
        future: Future[SynthesisOutput] = Future()
        with self._lock:
            self._pending += 1
        self._queue.put((request, future))
        return future

    def run_first(self, task: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            self._pending += 1
            self._first.append((task, future))
        self._queue.put(_WAKE)
        return future

    def in_flight(self) -> int:
        with self._lock:
            return self._pending

    def alone(self) -> int:
        return 0  # no rows: every request runs one at a time

    def failed(self) -> bool:
        return False  # each request's error is its own future's: the loop itself goes on

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _loop(self) -> None:
        while (item := self._next()) is not None:
            self._run_firsts()
            if item is _WAKE:
                continue
            request, future = item
            self._settle(future, partial(self.engine.synthesize, request))
        self._run_firsts()

    def _next(self) -> Any:
        """The next item; an idle model thread gives its OpenMP team back before it waits, so
        a job the worker runs on another thread meanwhile is not slowed by it."""
        if self._queue.empty():
            release_thread_team()
        return self._queue.get()

    def _run_firsts(self) -> None:
        while True:
            with self._lock:
                if not self._first:
                    return
                task, future = self._first.popleft()
            self._settle(future, task)

    def _settle(self, future: Future[Any], task: Callable[[], Any]) -> None:
        if future.set_running_or_notify_cancel():
            try:
                future.set_result(task())
            except BaseException as e:  # the job boundary classifies it
                future.set_exception(e)
        with self._lock:
            self._pending -= 1


def open_batch_session(engine: SynthesisEngine, max_batch: int) -> BatchSession:
    """The engine's own batched session when it has one, else a sequential one."""
    if max_batch > 1 and isinstance(engine, BatchingEngine):
        return engine.open_batch_session(max_batch)
    return SequentialSession(engine, max_batch)


def one_at_a_time(engine: SynthesisEngine, max_batch: int, *, llm: str) -> SequentialSession:
    """A sequential session for an engine whose LLM (`llm`, its class name) cannot batch; a
    batching worker (max_batch > 1) says so in its log."""
    if max_batch > 1:
        log.warning(
            "batch_session_sequential",
            max_batch=max_batch,
            llm=llm,
            reason="this LLM has no batched decoder (the torch LLM and the int8 ONNX Runtime "
            "step have one; a Core ML LLM keeps its own batch-1 state): one request at a time",
        )
    return SequentialSession(engine, max_batch)
