"""CosyqWorker: an RQ SimpleWorker that loads the model once, takes N jobs, then retires.

Usable as `rq worker -w workers.worker.CosyqWorker -S rq.serializers.JSONSerializer <queues>` and
via `cosyq-worker run`. No fork: Core ML and Metal are not fork-safe, so jobs run in this
process. Start-up happens in RQ's `bootstrap()` hook (workers/service/lifecycle.py: host checks,
housekeeping that reaps what a dead predecessor left, engine load + warm-up, `worker_ready`),
then RQ's loop runs; `teardown()` stops the housekeeping. Per job: admission (allow-list, JSON
only), then one attempt's books (workers/service/attempts.py: begin, RQ's execute, end), the
same books a batch window keeps for each of its jobs. Failures are classified once at the job
boundary (`handle_exception`); after a `storage` one, storage is probed again before the next
job, and a worker whose storage fails it leaves as at start (workers/service/storage_check.py).
A batch window whose model thread failed retires the worker at once (`model_failed`).
Stops never lose a job (workers/service/dequeue.py): the first
SIGTERM/SIGINT finishes the current job or gives back a popped one, a second one gives the job
back and exits at once.
"""

from __future__ import annotations

import inspect
import os
import socket
import threading
from collections.abc import Sequence
from types import FrameType
from typing import Any, NoReturn

import redis
from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT, DEFAULT_LOGGING_FORMAT
from rq.job import Job
from rq.queue import Queue
from rq.serializers import JSONSerializer, resolve_serializer
from rq.suspension import is_suspended

from shared import job_events, keys, tenants
from shared.connection import redis_connection
from shared.logs import get_logger
from shared.settings import Settings, load_settings
from shared.settings_env import redact_urls
from workers.engine.openmp_pool import release_thread_team
from workers.service import admission, cancels, control, host, metrics, outcomes
from workers.service.attempts import AttemptBooks
from workers.service.batch_admission import batchable
from workers.service.batch_runner import BatchRunner
from workers.service.dequeue import StopSafeWorker
from workers.service.failures import CANCELED_KIND, JobError, classify
from workers.service.housekeeping import WorkerState
from workers.service.lifecycle import WorkerIdentity, WorkerLifecycle
from workers.service.outage import (
    REDIS_OUTAGE,
    STOP_BOUND,
    STOP_WAIT_EXIT_CODE,
    until_reachable_or_stopped,
    wait_for_redis,
)
from workers.service.recycling import RecyclePolicy, RecycleReason, RecycleTracker
from workers.service.storage_check import StorageCheck

log = get_logger(__name__)

# How often the thread that listens on the worker's RQ channel (`rq suspend`, kill-horse) looks
# at its socket and at its stop flag. RQ starts it with 60 s, and from redis-py 8.2 on
# `PubSubWorkerThread.stop()` waits for the thread: every worker's exit took up to 60 s.
PUBSUB_POLL_S = 0.5


def default_worker_name() -> str:
    """host.pid.random: readable in `cosyq status`, unique even when a pid is reused."""
    return f"{socket.gethostname().split('.')[0]}.{os.getpid()}.{os.urandom(2).hex()}"


class CosyqWorker(StopSafeWorker):
    """RQ SimpleWorker subclass; RQ's constructor options pass through unchanged.

    Extra keyword options:
        settings: the process's Settings (read from the environment when omitted).
        control_fd: write end of the pool's control pipe (set by `cosyq-worker pool`).
        slot: the pool slot number, shown in logs and `cosyq status`.
    The serializer is always RQ's JSONSerializer and the job class always CosyqJob, whatever
    `rq worker -S/-j` said: a cosyq worker never unpickles and never runs foreign callables.
    """

    job_class = admission.CosyqJob
    log_result_lifespan = False  # one line per job is enough: synthesis_finished

    def __init__(
        self,
        queues: Sequence[str | Queue] | str | Queue = (),
        *args: Any,
        settings: Settings | None = None,
        control_fd: int | None = None,
        slot: int | None = None,
        **kwargs: Any,
    ) -> None:
        self.settings = settings if settings is not None else load_settings()
        STOP_BOUND.disarm()  # a stop asked of an earlier worker in this process is not ours
        self._requested_serializer = kwargs.get("serializer")
        kwargs["serializer"] = JSONSerializer
        kwargs["job_class"] = admission.CosyqJob
        kwargs["log_job_description"] = False  # RQ's description repeats the request text
        kwargs.setdefault("default_result_ttl", self.settings.result_ttl_s)
        if not args and not kwargs.get("name"):
            kwargs["name"] = default_worker_name()
        if kwargs.get("connection") is None:
            kwargs["connection"] = redis_connection(self.settings)
        if kwargs.get("prepare_for_work", True):
            wait_for_redis(kwargs["connection"])  # RQ's constructor talks to Redis
        self.tenants = self.settings.tenant_names()
        super().__init__(_queue_names(queues, self.tenants), *args, **kwargs)
        self.dequeue_poll_s = self.settings.dequeue_poll_s
        self.slot = slot
        self.control = control.ControlChannel(control_fd) if control_fd is not None else None
        policy = RecyclePolicy.from_settings(self.settings)
        self.tracker = RecycleTracker(policy, job_budget=policy.job_budget())
        identity = WorkerIdentity(
            name=self.name,
            hostname=self.hostname or "",
            queue_names=tuple(self.queue_names()),
            slot=slot,
        )
        self.lifecycle = WorkerLifecycle(
            self.settings,
            identity,
            self.connection,
            channel=self.control,
            job_budget=self.tracker.job_budget,
        )
        self._failures: dict[str, JobError] = {}
        self.storage_check = StorageCheck(
            self.lifecycle.recheck_storage, self.lifecycle.storage_lost
        )
        self._webhooks = job_events.WebhookPolicy.from_settings(self.settings)
        self._timed_out = False
        self._retire_lock = threading.Lock()
        self._retire_announced = False
        self._current: tuple[Job, Queue] | None = None  # a lone job registered as started
        self.books = AttemptBooks(
            self, self.lifecycle.housekeeper, self.settings, on_end=self._after_job
        )
        # COSYQ_BATCH_SIZE > 1: synthesize jobs run together (workers/service/batch_runner.py)
        self._batch = (
            BatchRunner(self.settings, self.connection, self.queues, books=self.books, gate=self)
            if self.settings.batch_size > 1
            else None
        )
        self._rq_max_jobs: int | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def work(self, *args: Any, **kwargs: Any) -> bool:
        """RQ's loop unchanged; only `max_jobs` is noted (a batch counts each of its jobs).

        Raises StorageError once storage failed its probe mid-run, as a start-up probe does."""
        bound = inspect.signature(super().work).bind(*args, **kwargs)
        self._rq_max_jobs = bound.arguments.get("max_jobs")
        worked = super().work(*args, **kwargs)
        if self.storage_check.lost is not None:
            raise self.storage_check.lost
        return worked

    def bootstrap(
        self,
        logging_level: str | None = "INFO",
        date_format: str = DEFAULT_LOGGING_DATE_FORMAT,
        log_format: str = DEFAULT_LOGGING_FORMAT,
    ) -> None:
        """Load the engine and announce it, then RQ's own bootstrap (registration)."""
        requested = self._requested_serializer
        if requested is not None and resolve_serializer(requested) is not JSONSerializer:
            log.warning(
                "serializer_overridden",
                requested=str(requested),
                using="rq.serializers.JSONSerializer",
            )
        try:
            # a stop signal is handled from the moment the worker says it is ready (RQ would
            # install its handlers only in work(), after the batch session and registration:
            # a SIGTERM in between killed a worker that metrics and the pool called idle)
            self.lifecycle.start(
                duties=[self.lifetime_duty], before_ready=self._install_signal_handlers
            )
            if self._batch is not None:
                # before the first job: a session that cannot open fails here
                self._batch.start_session()
            super().bootstrap(logging_level, date_format, log_format)
        except BaseException:
            self._close()
            raise

    def subscribe(self) -> None:
        """RQ's channel listener, polling every PUBSUB_POLL_S so that exit never waits long."""
        log.debug("worker_subscribing", channel=self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        pubsub = self.pubsub
        subscribed = until_reachable_or_stopped(  # Redis away since the worker said ready
            lambda: pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload}) or True,
            "worker_subscribe_waiting",
            stopped=lambda: self._stop_requested,
        )
        if subscribed is None:
            return  # stopped while Redis was away: nothing to listen for, the loop exits
        # RQ declares the attribute as None until it subscribes, as here
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]
            sleep_time=PUBSUB_POLL_S, daemon=True, exception_handler=self._pubsub_exception_handler
        )

    def unsubscribe(self) -> None:
        """RQ's, with the listener told to stop before the channel is left: the unsubscribe
        reply then ends its last read. Told after, it has already gone round to wait
        PUBSUB_POLL_S once more with no channel, and every exit took that much longer.

        A stopped listener whose last read ends by its own timeout closes the connection
        itself, and may do so while the unsubscribe is being sent (a ConnectionError, "Bad
        file descriptor"): the server has then left the channel with the connection, so the
        listener is only waited for and the pubsub closed, as RQ's own unsubscribe ends."""
        thread = self.pubsub_thread
        if thread is None:  # never subscribed (a stop while Redis was away)
            if self.pubsub is not None:
                self.pubsub.close()
            return
        thread.stop()
        try:
            super().unsubscribe()
        except redis.ConnectionError:
            log.info("worker_pubsub_closed_by_listener", channel=self.pubsub_channel_name)
            thread.join(timeout=1)
            self.pubsub.close()

    def _start_scheduler(self, *args: Any, **kwargs: Any) -> None:
        """RQ's scheduler forks: never started here (retries are promoted by housekeeping)."""
        log.warning("scheduler_not_started", why="RQ's scheduler forks; retries are promoted")

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            self._close()

    def _close(self) -> None:
        if self._batch is not None:
            self._batch.close()
        self.lifecycle.stop()

    def between_jobs(self) -> None:
        """Storage in doubt: probe it before the next pop. Alone: retire when the lifetime
        ends. Pooled: act on the pool's retirement grant."""
        if not self._stop_requested and self.storage_check.recheck() is not None:
            self._stop_requested = True  # storage lost: no more jobs, leave as at start
            self.lifecycle.housekeeper.set_state(WorkerState.STOPPING)
            return
        if self.control is None:
            if self.tracker.lifetime_expired():
                self._retire(RecycleReason.LIFETIME)
            return
        for message in self.control.receive():
            if message.event == control.RETIRE and not self._stop_requested:
                log.info("worker_retire_granted", jobs_done=self.tracker.jobs_done)
                self._stop_requested = True
                self.lifecycle.housekeeper.set_state(WorkerState.STOPPING)

    def refuse_unreadable_job(self, job_id: str, queue: Queue, error: Exception) -> None:
        self.books.refuse_unreadable(job_id, queue, error)

    def execute_popped(self, job: Job, queue: Queue) -> None:
        refusal = admission.screen(job, self.tenants)
        if refusal is not None:
            self.books.refuse(job, queue, refusal)
        elif cancels.canceled_before_start(self.connection, job):
            cancels.record_canceled(self.connection, job, queue, webhooks=self._webhooks)
        elif self._batch is not None and batchable(job):
            if not self._batch.run(job, queue):  # its books end each job it admits
                self._retire(RecycleReason.MODEL_FAILED)  # its model thread failed
        else:
            try:
                self.books.run_alone(job, queue, self._execute_alone)
            finally:
                if self._batch is not None:
                    # the batch session's model thread runs the windows: this thread's team,
                    # parked, would slow every parallel region there (workers/engine/openmp_pool)
                    release_thread_team()

    def _execute_alone(self, job: Job, queue: Queue) -> None:
        """RQ's SimpleWorker execute, the started job noted for a cold stop meanwhile."""
        self._current = (job, queue)
        try:
            super().execute_popped(job, queue)
        finally:
            self._current = None

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        """Classify the failure once; log one line (a traceback only for internal errors)."""
        error = classify(exc_info[1], timeout_s=job.timeout)
        self._failures[job.id] = error
        self.storage_check.note_failure(job.id, error.kind)  # no new job until it is probed
        self._timed_out = self._timed_out or error.timed_out
        if not error.retryable:
            job.retries_left = 0  # permanent or internal: RQ must not retry it
        if error.kind != CANCELED_KIND:  # a cancel is logged job_canceled when recorded
            log.warning(
                "job_failed",
                job_id=job.id,
                kind=error.kind,
                reason=error.message,
                will_retry=bool(job.retries_left),
                exc_info=exc_info if error.wants_traceback else None,
            )
        for handler in self._exc_handlers:
            if handler(job, *exc_info) is False:
                break

    def handle_execution_ended(self, job: Job, queue: Queue, heartbeat_ttl: int) -> None:
        record = super().handle_execution_ended
        outcomes.when_reachable(
            lambda: record(job, queue, heartbeat_ttl), job_id=job.id, step="ended"
        )

    def handle_job_success(
        self, job: Job, queue: Queue, started_job_registry: Any, execution: Any
    ) -> None:
        """Write the result; if Redis is away, keep it and write it once Redis is back."""
        self.books.note_outcome(job, "finished")
        record, tried = super().handle_job_success, False

        def write() -> None:
            nonlocal tried
            if tried and outcomes.already_finished(job):
                return  # the reply was lost, the write was not
            tried = True
            job_events.job_ended(self.connection, job, "job.finished", self._webhooks)
            record(job, queue, started_job_registry, execution)

        outcomes.record_ended(self.connection, job, write, "job.finished", self._webhooks)

    def handle_job_failure(
        self,
        job: Job,
        queue: Queue,
        started_job_registry: Any = None,
        exc_string: str = "",
        execution: Any = None,
    ) -> None:
        """Store the short reason in job.meta and as RQ's exc_info (no traceback soup)."""
        error = self._failures.pop(job.id, None)
        if error is not None and error.kind == CANCELED_KIND:  # canceled, never failed
            self.books.note_outcome(job, "canceled")
            cancels.record_canceled(
                self.connection, job, queue, execution=execution, webhooks=self._webhooks
            )
            return
        retrying = job.should_retry and self._stopped_job_id != job.id
        self.books.note_outcome(job, "retried" if retrying else "failed")
        if error is not None:
            meta_key = keys.LAST_ERROR_META_KEY if retrying else keys.ERROR_META_KEY
            job.meta[meta_key] = error.as_meta()
            if not error.wants_traceback:
                exc_string = f"{error.kind}: {error.message}"
        # a traceback may quote a URL with its password; its last line reaches the tenant
        exc_string = redact_urls(exc_string, keep_user=False)
        record = super().handle_job_failure
        event: job_events.EventName | None = None if retrying else "job.failed"

        def write() -> None:
            # RQ logs and drops a failed write of its own: wait for Redis before it runs.
            if error is not None:
                job.save_meta()
            else:
                self.connection.ping()
            if event is not None:
                job_events.job_ended(self.connection, job, event, self._webhooks)
            record(job, queue, started_job_registry, exc_string, execution)

        outcomes.record_ended(self.connection, job, write, event, self._webhooks)

    # -- recycling ---------------------------------------------------------------------------

    def admission_open(self) -> bool:
        """False once the worker is stopping or retiring, or its storage is in doubt: a batch
        then takes no new job."""
        if self.storage_check.in_doubt:
            return False
        return not self._stop_requested and not self._retire_announced

    def jobs_left(self) -> int:
        """Jobs this process may still take: its recycling budget, and `--max-jobs` if given."""
        budget = self.tracker.job_budget
        if self._rq_max_jobs is not None:
            budget = min(budget, self._rq_max_jobs)
        return budget - self.tracker.jobs_done

    def window_heartbeat(self) -> bool:
        """A long batch window's stand-in for RQ's loop: the worker key, `rq suspend`."""
        self.heartbeat()  # an outage is logged, never raised
        try:
            return bool(is_suspended(self.connection, self))
        except REDIS_OUTAGE as e:
            log.warning("suspension_check_failed", error=str(e))
            return False

    def _after_job(self, model_idle: bool = True) -> None:
        """Recycling's count of one job that left this worker; `model_idle`: no other job is
        still on the model (only then is an accelerator's cache released)."""
        if model_idle:
            host.release_accelerator_cache(self.lifecycle.device)
        reason = self.tracker.after_job(rss_mb=host.rss_mb(), timed_out=self._timed_out)
        self._timed_out = False
        if self._batch is not None and self.jobs_left() <= 0 and self._rq_max_jobs is not None:
            self._stop_requested = True  # RQ's own count sees one job per batch window
        if reason is not None:
            self._retire(reason)

    def _retire(self, reason: RecycleReason) -> None:
        """Leave (or, under the pool, ask to leave) once the current job is done."""
        with self._retire_lock:
            pooled = self.control is not None and self.control.open
            if not (self._retire_announced or self._stop_requested):
                metrics.record_recycle(reason.value)
            if pooled and not reason.urgent:
                if not self._retire_announced:
                    self._retire_announced = True
                    self._log_retiring(reason, waiting_for_pool=True)
                    assert self.control is not None
                    self.control.send(control.RETIRING, reason.value)
                return
            if not self._stop_requested:
                self._log_retiring(reason, waiting_for_pool=False)
            self._stop_requested = True

    def _log_retiring(self, reason: RecycleReason, *, waiting_for_pool: bool) -> None:
        log.info(
            "worker_retiring",
            reason=reason.value,
            jobs_done=self.tracker.jobs_done,
            job_budget=self.tracker.job_budget,
            rss_mb=round(host.rss_mb()),
            waiting_for_pool=waiting_for_pool,
        )
        self.lifecycle.housekeeper.set_state(WorkerState.RETIRING)

    def lifetime_duty(self) -> None:
        """Housekeeping: a busy or idle worker past its lifetime asks the pool to replace it."""
        if self.tracker.lifetime_expired():
            self._retire(RecycleReason.LIFETIME)

    # -- signals -----------------------------------------------------------------------------

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        super().request_stop(signum, frame)
        self.lifecycle.housekeeper.stats.state = WorkerState.STOPPING  # published next tick
        STOP_BOUND.arm(self.settings.stop_redis_wait_s, self._give_up_on_redis)

    def _give_up_on_redis(self, event: str) -> NoReturn:
        """A warm stop that waited COSYQ_STOP_REDIS_WAIT_S for an unreachable Redis: the job in
        hand stays where Redis has it (queued, or started with a heartbeat that now expires, so
        a reaper gives it back) and the process exits STOP_WAIT_EXIT_CODE."""
        in_hand = [self._current[0].id] if self._current is not None else []
        if self._batch is not None:
            in_hand += [job_id for job_id, _, _ in self._batch.started()]
        log.error(
            "worker_stop_gave_up_on_redis",
            waiting_for=event,
            waited_s=self.settings.stop_redis_wait_s,
            jobs=in_hand,
            hint="the jobs stay started in Redis; a reaper gives them back once their "
            "heartbeat expires",
        )
        self.before_cold_exit()
        os._exit(STOP_WAIT_EXIT_CODE)

    def release_running(self) -> None:
        """Cold stop mid-job: release the started entries now instead of waiting for a reaper;
        a batch also pushes back what it popped and had not started."""
        current, execution = self._current, next(iter(self.executions.values()), None)
        if current is not None and execution is not None:
            job, queue = current
            self.lifecycle.release_started(job.id, execution.id, queue.name)
        if self._batch is not None:
            self._batch.push_back_unstarted()  # first: the started ones go ahead of them
            for job_id, execution_id, queue_name in reversed(self._batch.started()):
                self.lifecycle.release_started(job_id, execution_id, queue_name)  # each at the head

    def defer_cold_exit(self) -> bool:
        """A batch job changing hands (popped -> registered): exit once it is in one place."""
        return self._batch is not None and self._batch.guard.defer(self._cold_exit)

    def before_cold_exit(self) -> None:
        self.lifecycle.stop()


def _queue_names(
    queues: Sequence[str | Queue] | str | Queue, tenant_names: Sequence[str]
) -> list[str]:
    """Queue names only: queues built by `rq worker` carry its (pickle) serializer. None
    given: every known tenant's queues, priority by priority."""
    items = [queues] if isinstance(queues, str | Queue) else list(queues)
    names = [item.name if isinstance(item, Queue) else item for item in items]
    return names or list(tenants.queue_names(tenant_names))
