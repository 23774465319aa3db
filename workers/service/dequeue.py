"""Taking a job so that no stop, at any moment, loses it.

RQ pops our three queues with BLPOP, so from the pop until RQ registers the execution a job
lives only in this process's memory. RQ's own signal handler raises StopRequested whenever its
state says idle, which can land inside that window and drop a job Redis already handed over.
Here instead:
- a signal only sets a flag; nothing is ever raised from a signal handler;
- a blocking pop waits at most `dequeue_poll_s`, so a flagged stop is seen within that time;
- whatever was popped once a stop is flagged goes back to the head of its queue
  (`job_pushed_back`) before the worker leaves;
- a cold stop (second signal) that lands between the pop and the job's registration is
  deferred to the next checkpoint, milliseconds or one poll away; once the job is registered as
  started, the cold stop releases it like a dead worker's job.
What still slips through (a pop reply lost with its connection) is found by the orphan sweep.
Fair share: the queues of one priority (one per tenant) are taken in rotating order
(`reorder_queues`), priorities first.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from enum import StrEnum
from types import FrameType
from typing import Any, cast

import redis
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.queue import Queue
from rq.utils import as_text, now
from rq.worker import WorkerStatus

from shared import tenants
from shared.logs import get_logger
from workers.service.outage import (
    OutageTolerantWorker,
    until_reachable,
    until_reachable_or_stopped,
)

log = get_logger(__name__)

COLD_EXIT_CODE = 1  # second signal: the job was given back, the process stops at once
DUPLICATE_SIGNAL_WINDOW_S = 1.0  # Ctrl+C reaches a pool's children twice: ignore the echo
WORKER_KEY_REFRESHES_PER_TTL = 3  # RQ's worker key is refreshed this often per worker_ttl


def push_back(connection: redis.Redis, job_id: str, queue: Queue) -> None:
    """Return a popped job, not started, to the head of its queue (waits out an outage)."""
    until_reachable(lambda: connection.lpush(queue.key, job_id), "job_push_back_failed")
    log.info("job_pushed_back", job_id=job_id, queue=queue.name)


class Custody(StrEnum):
    """Where the job this process is taking stands, as a cold stop must know it."""

    NONE = "none"  # no job in hand
    TAKING = "taking"  # popping, or popped and not yet registered as started
    RUNNING = "running"  # registered as started: a give-back releases its started entry


class StopSafeWorker(OutageTolerantWorker):
    """A SimpleWorker whose stops never lose a popped job (see the module docstring).

    Subclasses run a job in `execute_popped`, hand a running job back in `release_running`,
    and may act between jobs in `between_jobs` (read a pool's messages, check a lifetime).
    """

    dequeue_poll_s: float = 1.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.custody = Custody.NONE
        self._cold_pending = False

    # -- hooks -------------------------------------------------------------------------------

    def between_jobs(self) -> None:
        """Called before every pop; may set `_stop_requested` (a retirement, a lifetime)."""

    def execute_popped(self, job: Job, queue: Queue) -> None:
        """Run one job that was popped and not given back: RQ's SimpleWorker path."""
        super().execute_job(job, queue)

    def release_running(self) -> None:
        """Cold stop while a job is registered as started: release it (subclass duty)."""

    def before_cold_exit(self) -> None:
        """Last words before `os._exit` (stop threads, close channels)."""

    def defer_cold_exit(self) -> bool:
        """True when a subclass will run `_cold_exit` itself, once a hand-over it guards ends."""
        return False

    # -- dequeue -----------------------------------------------------------------------------

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[Job, Queue] | None:
        """Pop the next job in priority order; None once a stop is flagged or idle too long.

        `timeout=None` (burst) is one non-blocking pass. Otherwise each pop blocks for at most
        `dequeue_poll_s`, and the loop goes round until a job, a stop or `max_idle_time`.
        """
        self.custody = Custody.TAKING
        result: tuple[Job, Queue] | None = None
        try:
            until_reachable_or_stopped(
                lambda: self.set_state(WorkerStatus.IDLE), "dequeue_failed", self._stopped
            )
            self.procline("Listening on " + ",".join(self.queue_names()))
            result = self._dequeue(timeout, max_idle_time)
            return result
        finally:
            if result is None:
                self._set_custody(Custody.NONE)

    def _dequeue(self, timeout: int | None, max_idle_time: int | None) -> tuple[Job, Queue] | None:
        idle_since = time.monotonic()
        refresh_s = max(1.0, self.worker_ttl / WORKER_KEY_REFRESHES_PER_TTL)
        while True:
            self.between_jobs()
            if self._stop_requested:
                return None
            waited = time.monotonic() - idle_since
            if max_idle_time is not None and waited >= max_idle_time:
                return None
            if self.last_heartbeat is None or (now() - self.last_heartbeat).total_seconds() > (
                refresh_s
            ):
                self.heartbeat()
            if self.should_run_maintenance_tasks:
                self.run_maintenance_tasks()
            wait: float | None = None
            if timeout is not None:
                wait = min(self.dequeue_poll_s, timeout)
                if max_idle_time is not None:
                    wait = max(0.01, min(wait, max_idle_time - waited))
            popped = until_reachable_or_stopped(
                functools.partial(self._pop, wait), "dequeue_failed", self._stopped
            )
            if popped is None:
                if timeout is None:
                    return None  # burst: the queues are empty
                continue
            queue, job_id = popped
            try:
                found = self._taken(queue, job_id)
            except BaseException:
                self.push_back(job_id, queue)
                raise
            if found is not None:
                return found

    def _pop(self, wait: float | None) -> tuple[Queue, str] | None:
        """One BLPOP over every queue (LPOP each in turn when `wait` is None)."""
        by_key = {queue.key: queue for queue in self._ordered_queues}
        if wait is None:
            for key, queue in by_key.items():
                blob = cast(bytes | None, self.connection.lpop(key))
                if blob is not None:
                    return queue, as_text(blob)
            return None
        reply = self.connection.blpop(list(by_key), timeout=wait)
        if reply is None:
            return None
        key, blob = cast(tuple[bytes, bytes], reply)
        return by_key[as_text(key)], as_text(blob)

    def _taken(self, queue: Queue, job_id: str) -> tuple[Job, Queue] | None:
        """A popped id: back to its queue if a stop came meanwhile, else the job to run."""
        if self._stop_requested:
            self.push_back(job_id, queue)
            return None
        try:
            job = until_reachable(
                lambda: self.job_class.fetch(
                    job_id, connection=self.connection, serializer=self.serializer
                ),
                "dequeue_fetch_failed",
            )
        except NoSuchJobError:
            return None  # deleted while queued: nothing to run or give back
        except Exception as e:
            self.refuse_unreadable_job(job_id, queue, e)
            return None
        if self._stop_requested:
            self.push_back(job_id, queue)
            return None
        self.reorder_queues(reference_queue=queue)
        self.log.info("Worker %s: %s: %s", self.name, queue.name, job.id)
        return job, queue

    def reorder_queues(self, reference_queue: Queue) -> None:
        """Fair share: the queue a job came from goes last among its priority's queues (one
        per tenant), so the next pop looks at the other tenants first; priorities keep their
        order. Replaces RQ's dequeue strategies, which would mix priorities."""
        by_name = {queue.name: queue for queue in self._ordered_queues}
        taken = reference_queue.name
        self._ordered_queues = [
            by_name[name]
            for group in tenants.priority_groups(list(by_name))
            for name in tenants.rotated_after(group, taken)
        ]

    def refuse_unreadable_job(self, job_id: str, queue: Queue, error: Exception) -> None:
        """A job hash that cannot be loaded: subclasses fail it; here it is only logged."""
        log.warning("job_unreadable", job_id=job_id, queue=queue.name, error=str(error))

    def push_back(self, job_id: str, queue: Queue) -> None:
        push_back(self.connection, job_id, queue)

    # -- one job -----------------------------------------------------------------------------

    def execute_job(self, job: Job, queue: Queue) -> None:
        """Give the job back if a stop came after the pop, else run it to the end."""
        try:
            if self._stop_requested:
                self.push_back(job.id, queue)
                return
            self.execute_popped(job, queue)
        finally:
            self._set_custody(Custody.NONE)

    def prepare_job_execution(self, job: Job, remove_from_intermediate_queue: bool = False) -> None:
        """RQ marks the job started; from here a cold stop releases it through the registry."""
        super().prepare_job_execution(job, remove_from_intermediate_queue)
        self._set_custody(Custody.RUNNING)

    def _stopped(self) -> bool:
        return bool(self._stop_requested)

    def _set_custody(self, custody: Custody) -> None:
        self.custody = custody
        if self._cold_pending and custody is not Custody.TAKING:
            self._cold_exit()

    # -- signals -----------------------------------------------------------------------------

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        """First signal: finish (or give back) the job in hand, then leave. Only sets flags."""
        log.info("worker_stop_requested", signal=signal.Signals(signum).name, mode="warm")
        self._shutdown_requested_date = now()
        signal.signal(signal.SIGINT, self.request_force_stop)
        signal.signal(signal.SIGTERM, self.request_force_stop)
        self.handle_warm_shutdown_request()
        self._stop_requested = True

    def request_force_stop(self, signum: int, frame: FrameType | None) -> None:
        """Second signal: give the job back and exit now (deferred while it is being taken)."""
        requested = self._shutdown_requested_date
        if requested is not None and (now() - requested).total_seconds() < (
            DUPLICATE_SIGNAL_WINDOW_S
        ):
            return
        log.warning(
            "worker_cold_shutdown", signal=signal.Signals(signum).name, custody=self.custody.value
        )
        self._stop_requested = True
        if self.custody is Custody.TAKING:
            self._cold_pending = True  # the next checkpoint knows where the job is
            return
        if not self.defer_cold_exit():
            self._cold_exit()

    def _cold_exit(self) -> None:
        if self.custody is Custody.RUNNING:
            self.release_running()
        self.before_cold_exit()
        with contextlib.suppress(redis.RedisError):
            self.register_death()
        os._exit(COLD_EXIT_CODE)
