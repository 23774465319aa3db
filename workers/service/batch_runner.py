"""Many synthesize jobs in flight in one worker, each kept whole in RQ's books.

`CosyqWorker.execute_job` hands the first job of a window to `BatchRunner.run`, which stays
until every job it admitted has its outcome recorded. Threads:
- this one (RQ's, the only one signals reach): pops more jobs while there is room (batch size
  and recycling budget), registers each with RQ exactly as a lone job (attempt count, retry
  policy, heartbeat, started registry, execution) and records each outcome (finished or failed
  registry, result TTL, retries) through RQ's own finalize steps;
- the engine's model thread (`BatchSession`): the model only;
- a small I/O pool: validation and voice lookup before the model, encoding and storage after.
Timeouts are per-job deadlines checked here (SIGALRM cannot time one of several jobs): a job
past its deadline fails as timed out and the worker retires. A stop closes admission: popped
jobs not yet started go back to the head of their queue, started ones are finished. A cold stop
waits (`guard`) while a job moves from popped to registered, so it finds each job in one place.
"""

from __future__ import annotations

import contextlib
import math
import queue
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

from rq.job import Job
from rq.queue import Queue
from rq.suspension import is_suspended
from rq.timeouts import JobTimeoutException
from rq.utils import now
from rq.worker import WorkerStatus

from shared.logs import get_logger
from workers import tasks
from workers.engine.api import SynthesisOutput
from workers.engine.batching import BatchSession, open_batch_session
from workers.service import admission, metrics
from workers.service.batch_admission import (
    BatchDequeue,
    ColdStopGuard,
    PoppedJobs,
    Unreadable,
    admission_room,
    batchable,
    synthesis_payload,
)
from workers.service.job_runtime import WorkerRuntime, current_runtime
from workers.service.outage import REDIS_OUTAGE

if TYPE_CHECKING:
    from rq.executions import Execution

    from workers.worker import CosyqWorker

log = get_logger(__name__)

IDLE_WAKE_S = 0.25  # longest sleep with nothing due: how fast a stop closes admission
CHECKS_EVERY_S = 5.0  # RQ worker heartbeat and `rq suspend` check during a long window
ExcInfo = tuple[Any, Any, Any]


@dataclass(eq=False)
class BatchJob:
    """One admitted job: its RQ objects, deadline and where it is in the pipeline."""

    job: Job
    queue: Queue
    admitted_at: float
    execution: Execution | None = None
    deadline: float = math.inf
    prepared: tasks.PreparedSynthesis | None = None
    future: Future[SynthesisOutput] | None = None
    done: bool = False  # outcome recorded (or timed out): later events about it are dropped


@dataclass(frozen=True)
class Event:
    """From the model thread or the I/O pool to this thread."""

    kind: str  # prepared, finished, failed
    job: BatchJob
    value: Any = None  # PreparedSynthesis, the result dict, or exc_info


@dataclass
class BusyClock:
    """Time during which the model had at least one request: the bench's idle share."""

    busy_s: float = 0.0
    most: int = 0  # the most jobs admitted at once in this worker
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


class BatchRunner:
    """Continuous admission and per-job bookkeeping around one BatchSession."""

    def __init__(self, worker: CosyqWorker) -> None:
        settings = worker.settings
        self.worker = worker
        self.batch_size = settings.batch_size
        self.wait_s = settings.batch_wait_ms / 1000
        self.poll_s = settings.batch_poll_ms / 1000
        self.guard = ColdStopGuard()  # the worker's cold stop waits while a job changes hands
        self.dequeue = BatchDequeue(worker.connection, worker.queues, self.guard)
        self.popped = PoppedJobs()
        self.events: queue.Queue[Event] = queue.Queue()
        self.pool = ThreadPoolExecutor(settings.batch_io_threads, "cosyq-batch-io")
        self.session: BatchSession | None = None
        self.jobs: dict[str, BatchJob] = {}  # admitted, outcome not yet recorded
        self.waiting: list[BatchJob] = []  # prepared, held back for company
        self.deferred: list[tuple[Job, Queue]] = []  # not batchable: run alone after the window
        self.clock = BusyClock()
        self.abandoned = False  # a job timed out on the model thread: it may be stuck
        self._closing = False
        self._queues_empty = False  # the last look at the queues found nothing to add
        self._checked_at = 0.0

    # -- the window ----------------------------------------------------------------------------

    def open(self) -> None:
        """The engine's batch session (its model thread), once per worker, after the load."""
        if self.session is None:
            self.session = open_batch_session(current_runtime().engine, self.batch_size)

    def run(self, job: Job, queue_: Queue) -> None:
        """Admit `job` and whatever joins it; return once every admitted job is recorded."""
        runtime = current_runtime()
        self.open()
        started, busy_before = time.perf_counter(), self.clock.snapshot()
        self._closing = False
        self._admit(job, queue_, runtime)
        admitted = 1
        while self.jobs or self.popped.held:
            admitted += self._admit_popped(runtime)
            self._top_up()
            self._flush_waiting()
            self._expire()
            self._periodic_checks()
            try:
                event = self.events.get(timeout=self._next_wake())
            except queue.Empty:
                continue
            self._handle(event)
        self.worker.set_state(WorkerStatus.IDLE)
        self._log_window(admitted, started, busy_before)
        self._run_deferred()

    def _open(self) -> bool:
        return not self._closing and self.worker.admission_open()

    def _room(self) -> int:
        return admission_room(
            batch_size=self.batch_size,
            held=len(self.jobs) + len(self.popped.held) + len(self.deferred),
            jobs_left=self.worker.jobs_left(),
            open_=self._open(),
        )

    def _top_up(self) -> None:
        room = self._room()
        self._queues_empty = room == 0 or not self._open()
        if room > 0:
            try:
                got = self.dequeue.pop(room, self.popped, self._refuse_unreadable)
            except REDIS_OUTAGE as e:
                log.warning("batch_dequeue_failed", error=str(e))
                got = 0
            self._queues_empty = got == 0

    def _admit_popped(self, runtime: WorkerRuntime) -> int:
        """Start what was popped; give it back if the worker is stopping or retiring."""
        if not self._open():
            with self.guard.held():
                self.dequeue.give_back(self.popped.take())
            return 0
        admitted = 0
        while self.popped.held:
            # A cold stop must find each job in exactly one place: popped, or admitted.
            with self.guard.held():
                job, queue_ = self.popped.held.pop(0)
                refusal = admission.screen(job)
                if refusal is not None:
                    self.worker._refuse(job, queue_, refusal)
                    self.worker._after_job(idle=False)
                elif not batchable(job):
                    self.deferred.append((job, queue_))
                    self._closing = True  # drain, then run it alone
                else:
                    self._admit(job, queue_, runtime)
                    admitted += 1
        return admitted

    def _admit(self, job: Job, queue_: Queue, runtime: WorkerRuntime) -> None:
        """RQ's start-of-job steps for one job, then its validation on the I/O pool."""
        with self.guard.held():  # a cold stop then finds it popped or registered
            self._register(job, queue_, runtime)

    def _register(self, job: Job, queue_: Queue, runtime: WorkerRuntime) -> None:
        worker = self.worker
        try:
            worker._prepare_attempt(job)
        except REDIS_OUTAGE as e:
            log.warning("job_not_started", job_id=job.id, error=str(e))
            worker.push_back(job.id, queue_)
            return
        entry = BatchJob(job, queue_, admitted_at=time.monotonic())
        self.jobs[job.id] = entry
        self.clock.most = max(self.clock.most, len(self.jobs))
        try:
            entry.execution = worker.prepare_execution(job)
        except REDIS_OUTAGE as e:
            log.warning("job_outcome_unrecorded", job_id=job.id, error=str(e))
            self._release(entry)
            return
        try:
            worker.prepare_job_execution(job, len(worker.queues) == 1)
            job.started_at = now()
            payload = synthesis_payload(job)
        except Exception:
            self._record_failure(entry, sys.exc_info())
            return
        entry.deadline = entry.admitted_at + float(job.timeout or worker.settings.job_timeout_s)
        context = tasks.JobContext.from_job(job)
        self.pool.submit(self._prepare, entry, runtime, payload, context)

    # -- beside the model ----------------------------------------------------------------------

    def _prepare(
        self, entry: BatchJob, runtime: WorkerRuntime, payload: Any, context: tasks.JobContext
    ) -> None:
        try:
            prepared = tasks.prepare_synthesis(runtime, payload, context)
        except BaseException:
            self.events.put(Event("failed", entry, sys.exc_info()))
        else:
            self.events.put(Event("prepared", entry, prepared))

    def _on_synthesized(self, entry: BatchJob, future: Future[SynthesisOutput]) -> None:
        """On the model thread: hand encoding and storage to the pool at once."""
        self.clock.leave()
        with contextlib.suppress(RuntimeError):  # the pool is shut down: the worker is exiting
            self.pool.submit(self._finish, entry, future, time.perf_counter())

    def _finish(self, entry: BatchJob, future: Future[SynthesisOutput], at: float) -> None:
        try:
            output = future.result()
            assert entry.prepared is not None
            result = tasks.finish_synthesis(
                current_runtime(), entry.prepared, output, synthesized_at=at
            )
        except BaseException:
            self.events.put(Event("failed", entry, sys.exc_info()))
        else:
            self.events.put(Event("finished", entry, result.model_dump(mode="json")))

    # -- this thread ---------------------------------------------------------------------------

    def _handle(self, event: Event) -> None:
        entry = event.job
        if entry.done:
            return
        if event.kind == "prepared":
            entry.prepared = event.value
            self.waiting.append(entry)
            self._flush_waiting()
        elif event.kind == "finished":
            self._record_success(entry, event.value)
        else:
            self._record_failure(entry, event.value)

    def _flush_waiting(self) -> None:
        """Submit prepared jobs: at once if the model is busy (they join at the next step) or
        no company is in sight (nothing left to pop, none of the admitted jobs still being
        prepared), else once the first has waited batch_wait_ms for the others."""
        if not self.waiting or self.session is None:
            return
        busy = self.session.in_flight() > 0
        preparing = sum(1 for e in self.jobs.values() if e.prepared is None and not e.done)
        alone = preparing == 0 and self._queues_empty
        full = len(self.waiting) >= self.batch_size
        first = min(entry.admitted_at for entry in self.waiting)
        if not (busy or alone or full or time.monotonic() >= first + self.wait_s):
            return
        for entry in self.waiting:
            assert entry.prepared is not None
            self.clock.enter()
            entry.future = self.session.submit(entry.prepared.engine_input)
            entry.future.add_done_callback(partial(self._on_synthesized, entry))
        self.waiting = []

    def _record_success(self, entry: BatchJob, return_value: dict[str, Any]) -> None:
        entry.done = True
        assert entry.execution is not None
        self.worker._outcome = None
        try:
            self.worker._finalize_success(entry.job, entry.queue, entry.execution, return_value)
        except REDIS_OUTAGE as e:
            log.warning("job_outcome_unrecorded", job_id=entry.job.id, error=str(e))
        except Exception:
            self._record_failure(entry, sys.exc_info())
            return
        timings = return_value.get("timings", {})
        metrics.record_stages(timings, float(return_value.get("duration_s", 0.0)))
        metrics.record_batch(int(return_value.get("batch_size", 1)))
        self._release(entry)

    def _record_failure(self, entry: BatchJob, exc_info: ExcInfo) -> None:
        entry.done = True
        if entry in self.waiting:
            self.waiting.remove(entry)
        self.worker._outcome = None
        if entry.execution is not None:
            try:
                self.worker._finalize_failure(entry.job, entry.queue, entry.execution, exc_info)
            except REDIS_OUTAGE as e:
                log.warning("job_outcome_unrecorded", job_id=entry.job.id, error=str(e))
        self._release(entry)

    def _release(self, entry: BatchJob) -> None:
        """The job left this worker's hands: drop its heartbeat, count it for recycling."""
        self.jobs.pop(entry.job.id, None)
        if self.worker._outcome is not None:  # set by RQ's success/failure handlers
            seconds = time.monotonic() - entry.admitted_at
            metrics.record_job(entry.queue.name, self.worker._outcome, seconds)
        self.worker.lifecycle.housekeeper.end_job(entry.job.id)
        self.worker._after_job(idle=not self.jobs)

    def _expire(self) -> None:
        """Per-job timeouts: fail (and retry by policy) each job past its deadline."""
        moment = time.monotonic()
        for entry in [e for e in self.jobs.values() if e.deadline <= moment and not e.done]:
            future = entry.future
            if future is not None and not future.cancel() and future.running():
                self.abandoned = True  # the model is still on it and cannot be interrupted
            timeout = entry.job.timeout
            error = JobTimeoutException(f"Task exceeded maximum timeout value ({timeout} seconds)")
            self._record_failure(entry, (JobTimeoutException, error, None))

    def _next_wake(self) -> float:
        moment = time.monotonic()
        wake = IDLE_WAKE_S
        if self._room() > 0:
            wake = min(wake, self.poll_s)
        if self.waiting:
            first = min(entry.admitted_at for entry in self.waiting)
            wake = min(wake, first + self.wait_s - moment)
        if self.jobs:
            wake = min(wake, min(e.deadline for e in self.jobs.values()) - moment)
        return max(0.001, wake)

    def _periodic_checks(self) -> None:
        """What RQ's loop does between jobs, for windows that last while work keeps coming."""
        moment = time.monotonic()
        if moment - self._checked_at < CHECKS_EVERY_S:
            return
        self._checked_at = moment
        try:
            self.worker.heartbeat()
            if is_suspended(self.worker.connection, self.worker):
                self._closing = True
        except REDIS_OUTAGE as e:
            log.warning("worker_heartbeat_failed", error=str(e))

    def _refuse_unreadable(self, unreadable: Unreadable) -> None:
        self.worker.refuse_unreadable_job(unreadable.job_id, unreadable.queue, unreadable.error)

    def _run_deferred(self) -> None:
        deferred, self.deferred = self.deferred, []
        for job, queue_ in deferred:
            if self.worker.admission_open():
                self.worker._run(job, queue_)
                self.worker._after_job()
            else:
                self.dequeue.give_back([(job, queue_)])

    def _log_window(self, jobs: int, started: float, busy_before: float) -> None:
        wall = time.perf_counter() - started
        busy = self.clock.snapshot() - busy_before
        log.info(
            "batch_window_closed",
            jobs=jobs,
            most_in_flight=self.clock.most,
            wall_s=round(wall, 4),
            model_busy_s=round(busy, 4),
            model_idle_share=round(max(0.0, 1 - busy / wall), 4) if wall > 0 else 0.0,
        )

    # -- stopping --------------------------------------------------------------------------------

    def give_back_all(self) -> None:
        """Cold stop (second signal): every job this worker holds goes back now."""
        lifecycle = self.worker.lifecycle
        for entry in list(self.jobs.values()):
            if entry.execution is not None and not entry.done:
                lifecycle.give_back(entry.job.id, entry.execution.id, entry.queue.name)
        self.dequeue.give_back(self.popped.take() + self.deferred)
        self.deferred = []

    def close(self) -> None:
        """Worker exit: stop the model thread, unless a timed-out job may still hold it."""
        self.pool.shutdown(wait=not self.abandoned, cancel_futures=True)
        if self.session is not None and not self.abandoned:
            self.session.close()
