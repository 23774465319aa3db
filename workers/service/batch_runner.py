"""Many synthesize jobs in flight in one worker, each kept whole in RQ's books.

`CosyqWorker.execute_popped` hands the first job of a window to `BatchRunner.run`, which stays
until every job it admitted has its outcome recorded. The runner keeps no books of its own: each
job's attempt goes through the same `AttemptBooks` as a lone job (workers/service/attempts.py),
and the worker is seen only through a narrow `WindowGate`. Threads:
- this one (RQ's, the only one signals reach): pops more jobs while there is room (batch size
  and recycling budget), begins and registers each attempt and records each outcome;
- the engine's model thread (`BatchSession`): the model only;
- a small I/O pool: validation and voice lookup before the model, encoding and storage after.
Timeouts are per-job deadlines checked here (SIGALRM cannot time one of several jobs): a job
past its deadline fails as timed out and the worker retires; its row stops at the model's next
step (its `should_stop` says so: `BatchJob.stop_check`) and no audio of it is stored (the retry
owns the key). Jobs too long for a row run alone beside the batch and hold no place in it (up to
COSYQ_BATCH_ALONE_JOBS of them), so other jobs take their places. A streamed job (`stream:
true`) runs on the model thread ahead of the rows, which pause meanwhile and then get as long
again before the next one (workers/service/streamed_first.py), so its first chunk never waits
for the window (a full window still takes one from a queue's head every
COSYQ_BATCH_STREAM_PEEK_MS). A job that cannot join at all (`add_voice`) goes straight back to
the head of its queue and admission closes: once the rows in flight are done, the worker takes
it next, alone. A stop closes admission too: popped jobs not yet started go back to the head of
their queue in order, started ones are finished; so does a row whose store failed for good (the
worker probes storage once the window drained). A cold stop waits (`guard`) while a job moves
from popped to registered, so it finds each job in one place: its queue, or the started registry
under a live heartbeat. Should the session's model thread fail, admission closes as on a stop,
the jobs it held keep its error, those it never took fail retryable (`WorkerModelFailedError`),
and `run` says False: the worker retires at once (`model_failed`) for a fresh model.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, Protocol

import redis
from rq.job import Job
from rq.queue import Queue
from rq.timeouts import JobTimeoutException

from shared import job_events
from shared.errors import WorkerModelFailedError
from shared.logs import get_logger
from shared.settings import Settings
from workers import tasks
from workers.engine.api import SynthesisInput, SynthesisOutput
from workers.engine.batching import BatchSession, SessionFailed, open_batch_session
from workers.service import admission, cancels, metrics
from workers.service.attempts import AttemptBooks, ExcInfo
from workers.service.batch_admission import (
    BatchDequeue,
    ColdStopGuard,
    PoppedJobs,
    Unreadable,
    admission_room,
    batchable,
    streamed,
    synthesis_payload,
)
from workers.service.batch_rows import BatchJob, BusyClock, Event
from workers.service.job_runtime import WorkerRuntime, current_runtime
from workers.service.outage import REDIS_OUTAGE
from workers.service.streamed_first import run_streamed

log = get_logger(__name__)

IDLE_WAKE_S = 0.25  # longest sleep with nothing due: how fast a stop closes admission
CHECKS_EVERY_S = 5.0  # RQ worker heartbeat and `rq suspend` check during a long window


class WindowGate(Protocol):
    """What a window asks of its worker, and nothing more."""

    def admission_open(self) -> bool:
        """False once the worker is stopping or retiring, or a job's store failed for good."""
        ...

    def jobs_left(self) -> int:
        """Jobs the worker may still take (recycling budget, `--max-jobs`)."""
        ...

    def window_heartbeat(self) -> bool:
        """RQ's worker heartbeat during a long window; True once `rq suspend` is set."""
        ...


class BatchRunner:
    """Continuous admission around one BatchSession; every attempt kept by `books`."""

    def __init__(
        self,
        settings: Settings,
        connection: redis.Redis,
        queues: Sequence[Queue],
        *,
        books: AttemptBooks,
        gate: WindowGate,
    ) -> None:
        self.settings = settings
        self.books = books
        self.gate = gate
        self.batch_size = settings.batch_size
        self.tenants = settings.tenant_names()  # a job naming another one is refused
        self.webhooks = job_events.WebhookPolicy.from_settings(settings)
        self.wait_s = settings.batch_wait_ms / 1000
        self.poll_s = settings.batch_poll_ms / 1000
        self.peek_s = settings.batch_stream_peek_ms / 1000
        self._peeked_at = 0.0
        self.guard = ColdStopGuard()  # the worker's cold stop waits while a job changes hands
        self.dequeue = BatchDequeue(connection, queues, self.guard)
        self.popped = PoppedJobs()
        self.parked: list[tuple[Job, Queue]] = []  # cannot join: going back to their queues
        self.events: queue.Queue[Event] = queue.Queue()
        self.pool = ThreadPoolExecutor(settings.batch_io_threads, "cosyq-batch-io")
        # streamed jobs, one at a time (the model thread runs them one at a time anyway)
        self.streams = ThreadPoolExecutor(1, "cosyq-batch-stream")
        self.session: BatchSession | None = None
        self.jobs: dict[str, BatchJob] = {}  # admitted, outcome not yet recorded
        self.waiting: list[BatchJob] = []  # prepared, held back for company
        self.clock = BusyClock()
        self.abandoned = False  # a job timed out on the model thread: it may be stuck
        self.model_failed = False  # the session's model thread failed: the worker retires
        self._closing = False
        self._queues_empty = False  # the last look at the queues found nothing to add
        self._checked_at = 0.0
        self._admitted = 0  # this window's jobs
        self._most = 0  # the most jobs in flight at once in this window

    # -- the window ----------------------------------------------------------------------------

    def start_session(self) -> None:
        """The engine's batch session (its model thread), once per worker, after the load
        (on CUDA this captures the decode graphs: `batch_session_opened` says how long)."""
        if self.session is None:
            started = time.perf_counter()
            self.session = open_batch_session(current_runtime().engine, self.batch_size)
            seconds = round(time.perf_counter() - started, 3)
            log.info("batch_session_opened", batch_size=self.batch_size, seconds=seconds)

    def run(self, job: Job, queue_: Queue) -> bool:
        """Admit `job` and whatever joins it; return once every admitted job is recorded.
        False when the session's model thread failed: the worker must retire now."""
        runtime = current_runtime()
        self.start_session()
        started, busy_before = time.perf_counter(), self.clock.snapshot()
        self._closing, self._admitted, self._most = False, 0, 0
        self._admit(job, queue_, runtime)
        while self.jobs or self.popped.held:
            self._note_model_failure()
            self._admit_popped(runtime)
            self._top_up()
            self._flush_waiting()
            self._drain_events()  # a job that finished in time is never judged late
            self._expire()
            self._periodic_checks()
            try:
                event = self.events.get(timeout=self._next_wake())
            except queue.Empty:
                continue
            self._handle(event)
        self._note_model_failure()  # set before the crash settled the last row
        self._log_window(started, busy_before)
        return not self.model_failed

    def _note_model_failure(self) -> None:
        """Once the session's model thread failed, admission closes (popped jobs go back to
        their queues' heads) and jobs not yet submitted fail retryable (`_flush_waiting`)."""
        if self.model_failed or self.session is None or not self.session.failed():
            return
        self.model_failed = self._closing = True
        log.error("batch_model_failed", jobs=len(self.jobs), popped=len(self.popped.held))

    def _admitting(self) -> bool:
        return not self._closing and self.gate.admission_open()

    def _room(self) -> int:
        return admission_room(
            batch_size=self.batch_size,
            held=len(self.jobs) + len(self.popped.held),
            jobs_left=self.gate.jobs_left(),
            open_=self._admitting(),
            beside=self._beside(),
        )

    def _beside(self) -> int:
        """Jobs the session runs alone (too long for a row), up to COSYQ_BATCH_ALONE_JOBS:
        they hold no row, so their places take other jobs (they used to keep them while they
        waited their turn on the one alone lane, leaving the batch empty)."""
        alone = self.session.alone() if self.session is not None else 0
        return min(alone, self.settings.batch_alone_jobs)

    def _top_up(self) -> None:
        room = self._room()
        self._queues_empty = room == 0 or not self._admitting()
        if room > 0:
            try:
                got = self.dequeue.pop(room, self.popped, self._refuse_unreadable)
            except REDIS_OUTAGE as e:
                log.warning("batch_dequeue_failed", error=str(e))
                got = 0
            self._queues_empty = got == 0
        elif self._streamed_lane_open() and time.monotonic() >= self._peeked_at + self.peek_s:
            self._peeked_at = time.monotonic()
            try:
                self.dequeue.pop_streamed_head(self.popped)
            except REDIS_OUTAGE as e:
                log.warning("batch_dequeue_failed", error=str(e))

    def _streamed_lane_open(self) -> bool:
        """A full window still takes a streamed job at a queue's head (one at a time, within
        the recycling budget): it runs ahead of the rows, it does not need one."""
        held = len(self.jobs) + len(self.popped.held)
        return (
            self._admitting()
            and not self.popped.held
            and not any(entry.streamed for entry in self.jobs.values())
            and self.gate.jobs_left() > held
        )

    def _admit_popped(self, runtime: WorkerRuntime) -> None:
        """Start what was popped; give it back if the worker is stopping or retiring."""
        if self.popped.held and not self._admitting():
            with self.guard.held():
                self.dequeue.push_back_popped(self.popped.take())
            return
        while self.popped.held:
            # A cold stop must find each job in exactly one place: popped, or admitted.
            with self.guard.held():
                job, queue_ = self.popped.held.pop(0)
                refusal = admission.screen(job, self.tenants)
                if refusal is not None:
                    self.books.refuse(job, queue_, refusal, model_idle=not self.jobs)
                elif cancels.canceled_before_start(self.dequeue.connection, job):
                    connection = self.dequeue.connection
                    cancels.record_canceled(connection, job, queue_, webhooks=self.webhooks)
                elif batchable(job) or streamed(job):
                    self._admit(job, queue_, runtime)
                else:
                    self.parked.append((job, queue_))
        if self.parked:
            self._hand_back_parked()

    def _hand_back_parked(self) -> None:
        """A job that cannot join goes back to its queue's head now, in order, and admission
        closes: it never waits in memory, and the worker takes it next, once the rows drain."""
        with self.guard.held():
            parked, self.parked = self.parked, []
            self.dequeue.push_back_popped(parked)
        log.info("batch_admission_closed", why="a job that runs alone is next", jobs=len(parked))
        self._closing = True

    def _admit(self, job: Job, queue_: Queue, runtime: WorkerRuntime) -> None:
        """The attempt's start (books), then its validation on the I/O pool."""
        with self.guard.held():  # a cold stop then finds it popped or registered
            attempt = self.books.begin(job, queue_)
            if attempt is None:
                return
            entry = BatchJob(attempt, streamed=streamed(job))
            self.jobs[job.id] = entry
            if not self.books.register(attempt):
                self._end(entry)
                return
        self._admitted += 1
        self._most = max(self._most, len(self.jobs))
        try:
            payload = synthesis_payload(job)
        except Exception:
            self._record_failure(entry, sys.exc_info())
            return
        entry.deadline = attempt.began_at + float(job.timeout or self.settings.job_timeout_s)
        context = tasks.JobContext.from_job(
            job, cancel_check_s=self.settings.cancel_check_ms / 1000
        )
        if entry.streamed:
            lane = partial(run_streamed, session=self.session, clock=self.clock)
            self.streams.submit(lane, entry, runtime, payload, context, report=self.events.put)
        else:
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
        """On the model thread: claim the store (a row already failed as timed out drops its
        audio: the retry owns the key), then hand encoding and storage to the pool at once."""
        self.clock.leave()
        if not entry.claim_store():
            if not future.cancelled():
                log.warning("batch_row_dropped", job_id=entry.job_id, why="past its deadline")
            return
        with contextlib.suppress(RuntimeError):  # the pool is shut down: the worker is exiting
            self.pool.submit(self._finish, entry, future, time.perf_counter())

    def _finish(self, entry: BatchJob, future: Future[SynthesisOutput], at: float) -> None:
        try:
            output = future.result()
            assert entry.prepared is not None
            result = tasks.finish_synthesis(
                current_runtime(),
                entry.prepared,
                output,
                synthesized_at=at,
                resynthesize=self._resynthesize,
            )
        except BaseException:
            self.events.put(Event("failed", entry, sys.exc_info()))
        else:
            self.events.put(Event("finished", entry, result.model_dump(mode="json")))

    def _resynthesize(self, data: SynthesisInput) -> SynthesisOutput:
        """A suspect result synthesized again (new seed) on the same model thread, as one more
        request of the batch; waited for on this pool thread."""
        if self.session is None:
            raise RuntimeError("no batch session to synthesize on")
        try:
            future = self.session.submit(data)
        except SessionFailed as e:
            raise WorkerModelFailedError() from e
        return future.result()

    # -- this thread ---------------------------------------------------------------------------

    def _drain_events(self) -> None:
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                return
            self._handle(event)

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
        if self.model_failed:
            self._fail_unsubmitted(self.waiting)
            return
        busy = self.session.in_flight() > 0
        preparing = sum(
            1 for e in self.jobs.values() if e.prepared is None and not e.done and not e.streamed
        )
        alone = preparing == 0 and self._queues_empty
        full = len(self.waiting) >= self.batch_size
        first = min(entry.attempt.began_at for entry in self.waiting)
        if not (busy or alone or full or time.monotonic() >= first + self.wait_s):
            return
        waiting, self.waiting = self.waiting, []
        for index, entry in enumerate(waiting):
            assert entry.prepared is not None
            request = entry.prepared.engine_input
            stop = entry.stop_check(request.should_stop)  # canceled, or past its deadline
            try:
                entry.future = self.session.submit(dataclasses.replace(request, should_stop=stop))
            except SessionFailed:  # failed since the loop last looked
                self._note_model_failure()
                self._fail_unsubmitted(waiting[index:])
                return
            self.clock.enter()
            entry.future.add_done_callback(partial(self._on_synthesized, entry))

    def _fail_unsubmitted(self, entries: list[BatchJob]) -> None:
        """Prepared jobs the failed session never took: failed retryable, as they did nothing
        wrong, so RQ retries them (COSYQ_MAX_RETRIES) on another worker."""
        for entry in list(entries):
            error = WorkerModelFailedError()
            self._record_failure(entry, (WorkerModelFailedError, error, None))

    def _record_success(self, entry: BatchJob, return_value: dict[str, Any]) -> None:
        entry.done = True
        if self.books.succeed(entry.attempt, return_value):
            metrics.record_stages(
                return_value.get("timings", {}), float(return_value.get("duration_s", 0.0))
            )
            metrics.record_batch(int(return_value.get("batch_size", 1)))
        self._end(entry)

    def _record_failure(self, entry: BatchJob, exc_info: ExcInfo) -> None:
        entry.done = True
        if entry in self.waiting:
            self.waiting.remove(entry)
        self.books.fail(entry.attempt, exc_info)
        self._end(entry)

    def _end(self, entry: BatchJob) -> None:
        """The job left this worker's hands (books: metric, heartbeat, recycling count)."""
        self.jobs.pop(entry.job_id, None)
        self.books.end(entry.attempt, model_idle=not self.jobs)

    def _expire(self) -> None:
        """Per-job timeouts: fail (and retry by policy) each job past its deadline, unless
        its store has begun (then its own event settles it)."""
        moment = time.monotonic()
        for entry in [e for e in self.jobs.values() if e.deadline <= moment and not e.done]:
            if not entry.expire():
                continue
            future = entry.future
            if future is not None and not future.cancel() and future.running():
                self.abandoned = True  # the model is still on it and cannot be interrupted
            if entry.streamed:
                self.abandoned = True  # it stops at its next chunk, if the model gets there
            timeout = entry.attempt.job.timeout
            error = JobTimeoutException(f"Task exceeded maximum timeout value ({timeout} seconds)")
            self._record_failure(entry, (JobTimeoutException, error, None))

    def _next_wake(self) -> float:
        moment = time.monotonic()
        wake = IDLE_WAKE_S
        if self._room() > 0:
            wake = min(wake, self.poll_s)
        elif self._streamed_lane_open():
            wake = min(wake, self._peeked_at + self.peek_s - moment)
        if self.waiting:
            first = min(entry.attempt.began_at for entry in self.waiting)
            wake = min(wake, first + self.wait_s - moment)
        deadlines = [e.deadline for e in self.jobs.values() if not e.storing]
        if deadlines:
            wake = min(wake, min(deadlines) - moment)
        return max(0.001, wake)

    def _periodic_checks(self) -> None:
        """What RQ's loop does between jobs, for windows that last while work keeps coming."""
        moment = time.monotonic()
        if moment - self._checked_at < CHECKS_EVERY_S:
            return
        self._checked_at = moment
        if self.gate.window_heartbeat():
            self._closing = True

    def _refuse_unreadable(self, unreadable: Unreadable) -> None:
        self.books.refuse_unreadable(unreadable.job_id, unreadable.queue, unreadable.error)

    def _log_window(self, started: float, busy_before: float) -> None:
        wall = time.perf_counter() - started
        busy = self.clock.snapshot() - busy_before
        log.info(
            "batch_window_closed",
            jobs=self._admitted,
            most_in_flight=self._most,
            wall_s=round(wall, 4),
            model_busy_s=round(busy, 4),
            model_idle_share=round(max(0.0, 1 - busy / wall), 4) if wall > 0 else 0.0,
        )

    # -- stopping --------------------------------------------------------------------------------

    def started(self) -> list[tuple[str, str, str]]:
        """(job id, execution id, queue name) of each registered job not yet recorded, in the
        order they were admitted: a cold stop releases them as a dead worker's."""
        return [
            (entry.job_id, entry.attempt.execution.id, entry.attempt.queue.name)
            for entry in self.jobs.values()
            if entry.attempt.execution is not None and not entry.done
        ]

    def push_back_unstarted(self) -> None:
        """Cold stop: popped and parked jobs back to their queues' heads, in their order."""
        unstarted = self.popped.take() + self.parked
        self.parked = []
        self.dequeue.push_back_popped(unstarted)

    def close(self) -> None:
        """Worker exit: stop the model thread, unless a timed-out job may still hold it."""
        self.pool.shutdown(wait=not self.abandoned, cancel_futures=True)
        self.streams.shutdown(wait=not self.abandoned, cancel_futures=True)
        if self.session is not None and not self.abandoned:
            self.session.close()
