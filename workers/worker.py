"""CosyqWorker: an RQ SimpleWorker that loads the model once, takes N jobs, then retires.

Usable as `rq worker -w workers.worker.CosyqWorker -S rq.serializers.JSONSerializer <queues>` and
via `cosyq-worker run`. No fork: Core ML and Metal are not fork-safe, so jobs run in this
process. Start-up reads top-down in `work()`: host checks, housekeeping (reaps what a dead
predecessor left), engine load + warm-up, `worker_ready`, then RQ's loop. Per job: admission
(allow-list, JSON only), heartbeat, RQ's execute, recycle check. Failures are classified once at
the job boundary (`handle_exception`). Shutdown: the first SIGTERM/SIGINT finishes the current
job, a second one gives the job back and exits at once.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import socket
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

import redis
from rq.defaults import DEFAULT_LOGGING_DATE_FORMAT, DEFAULT_LOGGING_FORMAT
from rq.job import Job
from rq.queue import Queue
from rq.serializers import JSONSerializer, resolve_serializer
from rq.utils import now
from rq.worker import DequeueStrategy

from shared import keys
from shared.connection import redis_connection
from shared.logs import get_logger
from shared.settings import Settings, load_settings
from workers.service import admission, control, host, metrics, outcomes
from workers.service.failures import JobError, classify
from workers.service.lifecycle import WorkerLifecycle
from workers.service.outage import (
    REDIS_OUTAGE,
    OutageTolerantWorker,
    until_reachable,
    wait_for_redis,
)
from workers.service.recycling import RecyclePolicy, RecycleReason, RecycleTracker
from workers.service.retries import apply_default_retries

log = get_logger(__name__)

COLD_EXIT_CODE = 1  # second signal: the job was given back, the process stops at once
DUPLICATE_SIGNAL_WINDOW_S = 1.0  # Ctrl+C reaches a pool's children twice: ignore the echo


def default_worker_name() -> str:
    """host.pid.random: readable in `cosyq status`, unique even when a pid is reused."""
    return f"{socket.gethostname().split('.')[0]}.{os.getpid()}.{os.urandom(2).hex()}"


def effective_timeout(job_timeout: int | float | None, limit_s: int) -> int:
    """A job's own timeout, capped at the configured one (a job cannot ask for forever)."""
    if job_timeout is None or job_timeout <= 0:
        return limit_s
    return int(min(job_timeout, limit_s))


class CosyqWorker(OutageTolerantWorker):
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
        super().__init__(_queue_names(queues), *args, **kwargs)
        self.slot = slot
        self.control = control.ControlChannel(control_fd) if control_fd is not None else None
        policy = RecyclePolicy.from_settings(self.settings)
        self.tracker = RecycleTracker(policy, job_budget=policy.job_budget(_rng()))
        self.lifecycle: WorkerLifecycle | None = None
        self._failures: dict[str, JobError] = {}
        self._timed_out = False
        self._retire_lock = threading.Lock()
        self._retire_announced = False
        self._current: tuple[Job, Queue] | None = None
        self._handling_job = False
        self._outcome: str | None = None  # set by RQ's success/failure handlers, per attempt

    # -- lifecycle ---------------------------------------------------------------------------

    def work(  # noqa: PLR0917 - RQ's signature, positional parameters included
        self,
        burst: bool = False,
        logging_level: str | None = None,
        date_format: str = DEFAULT_LOGGING_DATE_FORMAT,
        log_format: str = DEFAULT_LOGGING_FORMAT,
        max_jobs: int | None = None,
        max_idle_time: int | None = None,
        with_scheduler: bool = False,
        dequeue_strategy: DequeueStrategy = DequeueStrategy.DEFAULT,
    ) -> bool:
        """Load the engine, then run RQ's loop (RQ's scheduler forks: never started here)."""
        if with_scheduler:
            log.warning("scheduler_not_started", why="RQ's scheduler forks; retries are promoted")
        self.lifecycle = WorkerLifecycle(self)
        try:
            self.lifecycle.start()
            requested = self._requested_serializer
            if requested is not None and resolve_serializer(requested) is not JSONSerializer:
                log.warning(
                    "serializer_overridden",
                    requested=str(self._requested_serializer),
                    using="rq.serializers.JSONSerializer",
                )
            return super().work(
                burst,
                logging_level,
                date_format,
                log_format,
                max_jobs,
                max_idle_time,
                False,
                dequeue_strategy,
            )
        finally:
            self.lifecycle.stop()

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        """RQ's dequeue, plus: wake up when the lifetime ends; fail unreadable job hashes."""
        if self.control is None:
            left = math.ceil(self.tracker.lifetime_left_s())
            if left <= 0:
                self._retire(RecycleReason.LIFETIME)
                return None
            max_idle_time = left if max_idle_time is None else min(max_idle_time, left)
        dequeue = super().dequeue_job_and_maintain_ttl
        while True:
            try:
                # RQ retries inside its blocking wait, not around it (state, heartbeat).
                result = until_reachable(lambda: dequeue(timeout, max_idle_time), "dequeue_failed")
            except Exception as e:
                if getattr(e, "job_id", None) is None:
                    raise
                self._refuse_unreadable(e)
                continue
            if result is None and self.tracker.lifetime_expired():
                self._retire(RecycleReason.LIFETIME)
            return result

    def execute_job(self, job: Job, queue: Queue) -> None:
        self._handling_job = True  # a stop signal from here on waits for the bookkeeping
        try:
            refusal = admission.screen(job)
            if refusal is not None:
                self._refuse(job, queue, refusal)
            else:
                self._run(job, queue)
            self._after_job()
        finally:
            self._handling_job = False

    # -- one job -----------------------------------------------------------------------------

    def _run(self, job: Job, queue: Queue) -> None:
        try:
            self._prepare_attempt(job)
        except REDIS_OUTAGE as e:
            log.warning("job_not_started", job_id=job.id, error=str(e))
            self._push_back(job, queue)
            return
        self._current, self._outcome = (job, queue), None
        started = time.perf_counter()
        try:
            super().execute_job(job, queue)
        except REDIS_OUTAGE as e:
            # A bookkeeping step outside the outcome writes failed (those wait for Redis
            # themselves): release the job once Redis is back, labelled for what happened.
            log.warning("job_bookkeeping_failed", job_id=job.id, error=str(e))
            outcomes.release_unrecorded(self.connection, queue, job, self.name)
        finally:
            self._current = None
            if self._outcome is not None:
                metrics.record_job(queue.name, self._outcome, time.perf_counter() - started)
            if self.lifecycle is not None:
                self.lifecycle.housekeeper.end_job(job.id)

    def _push_back(self, job: Job, queue: Queue) -> None:
        """Return a job we popped but could not start to the head of its queue."""
        until_reachable(lambda: self.connection.lpush(queue.key, job.id), "job_push_back_failed")
        log.info("job_pushed_back", job_id=job.id, queue=queue.name)

    def _prepare_attempt(self, job: Job) -> None:
        """Cap the timeout, count the attempt, give the default retry policy, claim heartbeat.

        A job requeued by hand (`rq requeue`, rq-dashboard, `cosyq failed --requeue`) keeps its
        meta: its old failure is cleared here, and the attempt count goes on from where it was.
        """
        job.timeout = effective_timeout(job.timeout, self.settings.job_timeout_s)
        previous = job.meta.get(keys.ATTEMPT_META_KEY, 0)
        job.meta[keys.ATTEMPT_META_KEY] = (previous if isinstance(previous, int) else 0) + 1
        job.meta.pop(keys.ERROR_META_KEY, None)
        apply_default_retries(
            job,
            max_retries=self.settings.max_retries,
            backoff_base_s=self.settings.retry_backoff_s,
        )
        fields: dict[str, str | int] = {"meta": json.dumps(job.meta)}
        if job.retries_left is not None:
            fields["retries_left"] = job.retries_left
        if job.retry_intervals is not None:
            fields["retry_intervals"] = json.dumps(job.retry_intervals)
        if self.lifecycle is not None:
            self.lifecycle.housekeeper.begin_job(job.id, fields)
        else:
            self.connection.hset(job.key, mapping=fields)  # type: ignore[arg-type]

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        """Classify the failure once; log one line (a traceback only for internal errors)."""
        error = classify(exc_info[1], timeout_s=job.timeout)
        self._failures[job.id] = error
        self._timed_out = self._timed_out or error.timed_out
        if not error.retryable:
            job.retries_left = 0  # permanent or internal: RQ must not retry it
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
        self._outcome = "finished"
        record, tried = super().handle_job_success, False

        def write() -> None:
            nonlocal tried
            if tried and outcomes.already_finished(job):
                return  # the reply was lost, the write was not
            tried = True
            record(job, queue, started_job_registry, execution)

        outcomes.when_reachable(write, job_id=job.id, step="success")

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
        retrying = job.should_retry and self._stopped_job_id != job.id
        self._outcome = "retried" if retrying else "failed"
        if error is not None:
            meta_key = keys.LAST_ERROR_META_KEY if retrying else keys.ERROR_META_KEY
            job.meta[meta_key] = error.as_meta()
            if not error.wants_traceback:
                exc_string = f"{error.kind}: {error.message}"
        record = super().handle_job_failure

        def write() -> None:
            # RQ logs and drops a failed write of its own: wait for Redis before it runs.
            if error is not None:
                job.save_meta()
            else:
                self.connection.ping()
            record(job, queue, started_job_registry, exc_string, execution)

        outcomes.when_reachable(write, job_id=job.id, step="failure")

    def _refuse(self, job: Job, queue: Queue, refusal: admission.Refusal) -> None:
        """Fail a job that must not run: no retry, no callbacks, no webhooks, nothing imported."""
        log.warning("job_refused", job_id=job.id, queue=queue.name, reason=refusal.message)
        metrics.record_job(queue.name, "refused")
        job.meta = {keys.ERROR_META_KEY: {"kind": refusal.kind, "message": refusal.message}}
        job.retries_left = 0
        job.webhooks = []
        job._success_callback_name = job._failure_callback_name = None
        job._stopped_callback_name = None
        job.ended_at = now()
        with self.connection.pipeline() as pipe:
            admission.record_refusal(job, f"{refusal.kind}: {refusal.message}", pipe)
            pipe.lrem(queue.intermediate_queue_key, 1, job.id)
            self.increment_failed_job_count(pipe)
            pipe.execute()

    def _refuse_unreadable(self, error: Exception) -> None:
        job_id = str(getattr(error, "job_id", ""))
        queue = getattr(error, "queue", None)
        queue_name = queue.name if isinstance(queue, Queue) else keys.QUEUE_DEFAULT
        reason = f"{type(error).__name__}: {error}"
        log.warning("job_refused", job_id=job_id, queue=queue_name, reason=reason)
        metrics.record_job(queue_name, "refused")
        admission.refuse_unreadable(
            self.connection, queue_name, job_id, reason, failure_ttl_s=self.settings.failure_ttl_s
        )

    # -- recycling ---------------------------------------------------------------------------

    def _after_job(self) -> None:
        if self.lifecycle is not None:
            host.release_accelerator_cache(self.lifecycle.device)
        reason = self.tracker.after_job(rss_mb=host.rss_mb(), timed_out=self._timed_out)
        self._timed_out = False
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
        if self.lifecycle is not None:
            self.lifecycle.housekeeper.set_state("retiring")

    def lifetime_duty(self) -> None:
        """Housekeeping: a busy or idle worker past its lifetime asks the pool to replace it."""
        if self.tracker.lifetime_expired():
            self._retire(RecycleReason.LIFETIME)

    # -- signals -----------------------------------------------------------------------------

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        """First signal: stop after the current job, including our bookkeeping after it.

        RQ raises StopRequested from the handler as soon as its own state says idle, which it
        does before our post-job steps (heartbeat release, recycle check) have run; while a
        job is being handled the stop is recorded instead, and the loop ends after it.
        """
        log.info("worker_stop_requested", signal=signal.Signals(signum).name, mode="warm")
        if self.lifecycle is not None:
            self.lifecycle.housekeeper.set_state("stopping")
        if not self._handling_job:
            super().request_stop(signum, frame)
            return
        self._shutdown_requested_date = now()
        signal.signal(signal.SIGINT, self.request_force_stop)
        signal.signal(signal.SIGTERM, self.request_force_stop)
        self.handle_warm_shutdown_request()
        self._stop_requested = True

    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        """Second signal: give the running job back to the queue and exit now."""
        requested = self._shutdown_requested_date
        if requested is not None and (now() - requested).total_seconds() < (
            DUPLICATE_SIGNAL_WINDOW_S
        ):
            return
        log.warning("worker_cold_shutdown", signal=signal.Signals(signum).name)
        if self._current is not None and self.lifecycle is not None:
            job, queue = self._current
            self.lifecycle.give_back(job, queue)
        if self.lifecycle is not None:
            self.lifecycle.stop()
        with contextlib.suppress(redis.RedisError):
            self.register_death()
        os._exit(COLD_EXIT_CODE)


def _queue_names(queues: Sequence[str | Queue] | str | Queue) -> list[str]:
    """Queue names only: queues built by `rq worker` carry its (pickle) serializer."""
    items = [queues] if isinstance(queues, str | Queue) else list(queues)
    names = [item.name if isinstance(item, Queue) else item for item in items]
    return names or list(keys.QUEUES_IN_PRIORITY_ORDER)


def _rng() -> random.Random:
    """Seeded per process so slots started together still draw different jitter."""
    return random.Random(int.from_bytes(os.urandom(8), "little"))
