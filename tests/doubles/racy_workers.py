"""CosyqWorker subclasses that deliver a stop at the worst moment of a dequeue, on purpose.

A last few kill themselves between two writes of a job's outcome (KillAfterWebhookEvent) or
in the middle of a document's assembly (KilledBeforeAssembly, KilledMidAssembly), and two run
a cancel, the producer's own, at the worst moment of a job's start (CanceledBeforeClaim,
CanceledInsideClaim).

Run with the stock CLI (`rq worker -w tests.doubles.racy_workers:<Class>`), so each test also
covers the path without a pool. Each hook fires once, on the first pop that returns a job
(or, for `SignalWhileBlocked`, on the first blocking pop).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any

import redis
from rq.queue import Queue

from shared import job_events
from shared.connection import redis_connection
from shared.keys import QUEUE_DEFAULT
from workers.service.dequeue import DUPLICATE_SIGNAL_WINDOW_S
from workers.worker import CosyqWorker

RACE_JOB_ENV = "TESTRACE_JOB_ID"  # SignalWhileBlocked pushes this job id while the pop waits


class SignalAfterPop(CosyqWorker):
    """SIGTERM to itself the instant the pop returns a job, before anything else runs."""

    fired = False

    def _pop(self, wait: float | None) -> tuple[Queue, str] | None:
        popped = super()._pop(wait)
        if popped is not None and not self.fired:
            self.fired = True
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next line
        return popped


class ColdAfterPop(CosyqWorker):
    """A warm stop, then (past the duplicate window) a cold one, both right after the pop."""

    fired = False

    def _pop(self, wait: float | None) -> tuple[Queue, str] | None:
        popped = super()._pop(wait)
        if popped is not None and not self.fired:
            self.fired = True
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(DUPLICATE_SIGNAL_WINDOW_S + 0.2)
            os.kill(os.getpid(), signal.SIGTERM)
        return popped


class HiccupAfterPop(SignalAfterPop):
    """As SignalAfterPop, and the give-back's first LPUSH fails as if Redis dropped away."""

    def push_back(self, job_id: str, queue: Queue) -> None:
        real = self.connection.lpush
        calls = {"n": 0}

        def flaky(*args: Any, **kwargs: Any) -> Any:
            calls["n"] += 1
            if calls["n"] == 1:
                raise redis.ConnectionError("test: connection dropped during the give-back")
            return real(*args, **kwargs)

        self.connection.lpush = flaky  # type: ignore[method-assign]
        try:
            super().push_back(job_id, queue)
        finally:
            self.connection.lpush = real  # type: ignore[method-assign]


class SignalWhileBlocked(CosyqWorker):
    """While the first blocking pop waits: SIGTERM to the main thread, then the job arrives."""

    fired = False

    def _pop(self, wait: float | None) -> tuple[Queue, str] | None:
        if wait is not None and not self.fired:
            self.fired = True
            threading.Thread(target=self._race, args=(threading.get_ident(),)).start()
        return super()._pop(wait)

    def _race(self, main_thread: int) -> None:
        side = redis_connection(self.settings)
        while not any(c.get("cmd") == "blpop" for c in side.client_list()):
            time.sleep(0.01)
        signal.pthread_kill(main_thread, signal.SIGTERM)  # interrupts the blocked read
        time.sleep(0.05)
        side.rpush(Queue(QUEUE_DEFAULT, connection=side).key, os.environ[RACE_JOB_ENV])
        side.close()


def _killed_before_enqueue(*args: Any, **kwargs: Any) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class KilledBeforeAssembly(CosyqWorker):
    """SIGKILL to itself where it would enqueue a document's assembly job: after the script that
    recorded the last segment (and set the assembly marker), before the job exists."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        import workers.documents.job as document_job  # noqa: PLC0415

        document_job.enqueue_assembly = _killed_before_enqueue  # type: ignore[assignment]


class KilledMidAssembly(CosyqWorker):
    """SIGKILL to itself in the middle of a document's assembly: under the claim, the file
    being written (its first segment read), nothing published."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        import workers.documents.job as document_job  # noqa: PLC0415

        written = document_job.write_document

        def killed_mid_write(*args: Any, read: Any, **kwargs: Any) -> Any:
            def read_then_die(uri: str) -> bytes:
                read(uri)
                os.kill(os.getpid(), signal.SIGKILL)
                raise AssertionError("unreachable")

            return written(*args, read=read_then_die, **kwargs)

        document_job.write_document = killed_mid_write  # type: ignore[assignment]


class KillAfterWebhookEvent(CosyqWorker):
    """SIGKILL itself right after a job's `job.finished` event is in the outbox, before RQ
    records the job finished: the next worker's reaper requeues it and it finishes again."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        recorded = job_events.job_ended

        def recorded_then_killed(connection: Any, job: Any, event: Any, policy: Any) -> None:
            recorded(connection, job, event, policy)
            if event == "job.finished":
                os.kill(os.getpid(), signal.SIGKILL)

        job_events.job_ended = recorded_then_killed  # type: ignore[assignment]


class RedisGoneBeforeRegistration(CosyqWorker):
    """Shuts Redis down (SHUTDOWN NOSAVE) after saying ready, just before RQ's registration:
    the outage lands between the ready line and the loop's first pop."""

    fired = False

    def register_birth(self) -> None:
        if not self.fired:
            self.fired = True
            _shut_down_redis(self.connection)
        super().register_birth()


class RedisGoneBeforeStarted(CosyqWorker):
    """Shuts Redis down right after the pubsub subscription, before RQ's bootstrap writes the
    worker's `started` state."""

    fired = False

    def subscribe(self) -> None:
        super().subscribe()
        if not self.fired:
            self.fired = True
            _shut_down_redis(self.connection)


CANCEL_VERDICT_PREFIX = "test:cancel-verdict:"  # + job id -> what the racing cancel answered


class CanceledBeforeClaim(CosyqWorker):
    """Runs a cancel of the first job it takes after its look at the cancel flag (found none)
    and before the job's start: the moment a DELETE lands between the two by chance. The
    cancel's answer is kept under CANCEL_VERDICT_PREFIX + job id."""

    fired = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        begin = self.books.begin

        def canceled_then_begun(job: Any, queue: Queue) -> Any:
            if not self.fired:
                self.fired = True
                _cancel(self, job.id)
            return begin(job, queue)

        self.books.begin = canceled_then_begun  # type: ignore[method-assign]


class CanceledInsideClaim(CosyqWorker):
    """Runs a cancel of the first job it takes inside the start's claim, once the claim has
    read the flag and the status and before its MULTI/EXEC (workers/service/cancels.py)."""

    fired = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from redis.client import Pipeline  # noqa: PLC0415

        from workers.service import housekeeping  # noqa: PLC0415

        claim, multi, armed = housekeeping.claim_start, Pipeline.multi, [""]

        def claim_with_cancel(connection: Any, job_id: str, *args: Any, **kwargs: Any) -> bool:
            armed[0] = job_id
            try:
                return claim(connection, job_id, *args, **kwargs)
            finally:
                armed[0] = ""

        def multi_after_cancel(pipe: Pipeline) -> None:
            if armed[0] and not self.fired:
                self.fired = True
                _cancel(self, armed[0])
            multi(pipe)

        housekeeping.claim_start = claim_with_cancel  # type: ignore[assignment]
        Pipeline.multi = multi_after_cancel  # type: ignore[method-assign]


def _cancel(worker: CosyqWorker, job_id: str) -> None:
    """The producer's cancel of `job_id` (its webhook told, as the front tells it), on a
    connection of its own; its answer kept for the test."""
    from producer.cancel import cancel_job  # noqa: PLC0415
    from producer.tracking import JobTracker  # noqa: PLC0415

    connection = redis_connection(worker.settings)
    tracker = JobTracker(connection, worker.settings)
    policy = job_events.WebhookPolicy.from_settings(worker.settings)
    outcome = cancel_job(connection, tracker, job_id, flag_ttl_s=600, webhooks=policy)
    connection.set(CANCEL_VERDICT_PREFIX + job_id, outcome.verdict)
    connection.close()


def _shut_down_redis(connection: redis.Redis) -> None:
    with contextlib.suppress(redis.ConnectionError):  # the server closes it as it goes
        connection.shutdown(nosave=True)
