"""The worker's side of canceling: the flag a running job checks, and the canceled record.

`cosyq cancel` (producer/cancel.py) sets `cosyq:cancel:<id>` before anything else, so:
- before a popped job starts, `canceled_before_start` reads the flag and the job's status (RQ's
  `Job.cancel()` may have run on it after the pop): a canceled job is recorded and never runs;
- while it runs, `CancelFlag` is the engine's `should_stop()`: one EXISTS at most every
  `COSYQ_CANCEL_CHECK_MS`, so a check per LLM step costs nothing;
- the engine then raises `SynthesisCanceled`; the job boundary calls `record_canceled`: status
  `canceled`, RQ's canceled registry (never failed, never retried), its started entry and the
  flag gone, and a `job.canceled` webhook event when the job asked for one. The hash names the
  cancel whose token the flag held (`keys.CANCELED_BY_FIELD`, unless a cancel's own transaction
  named itself first): that cancel, reading the job again, answers `canceled`; the others
  `already_canceled`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.registry import CanceledJobRegistry
from rq.utils import now, utcformat

from producer.webhooks import bodies
from shared import job_events, keys
from shared.logs import get_logger
from workers.service.outage import until_reachable

log = get_logger(__name__)


class CancelFlag:
    """`should_stop()` for one job: True once its cancel flag exists (read at most every
    `every_s`; a Redis error reads as "not canceled": an outage never stops a job)."""

    def __init__(self, connection: redis.Redis, job_id: str, *, every_s: float) -> None:
        self.connection = connection
        self.key = keys.cancel_key(job_id)
        self.every_s = every_s
        self._lock = threading.Lock()
        self._read_at = float("-inf")
        self._set = False

    def __call__(self) -> bool:
        with self._lock:
            moment = time.monotonic()
            if self._set or moment - self._read_at < self.every_s:
                return self._set
            self._read_at = moment
            try:
                self._set = bool(self.connection.exists(self.key))
            except redis.RedisError as e:
                log.warning("cancel_check_failed", key=self.key, error=str(e))
            return self._set


def canceled_before_start(connection: redis.Redis, job: Job) -> bool:
    """A popped job that must not start: its flag is set, or RQ canceled it after the pop."""
    try:
        with connection.pipeline(transaction=False) as pipe:
            pipe.exists(keys.cancel_key(job.id))
            pipe.hget(job.key, "status")
            flagged, status = pipe.execute()
    except redis.RedisError as e:
        log.warning("cancel_check_failed", job_id=job.id, error=str(e))
        return False
    return bool(flagged) or (status or b"").decode() == JobStatus.CANCELED.value


def record_canceled(
    connection: redis.Redis,
    job: Job,
    queue: Queue,
    *,
    execution: Any = None,
    webhooks: job_events.WebhookPolicy | None = None,
) -> None:
    """The job ends as canceled (see the module docstring); waits out a Redis outage."""
    job.retries_left = 0

    def write() -> None:
        if webhooks is not None:
            job_events.job_ended(connection, job, "job.canceled", webhooks)
        token = connection.get(keys.cancel_key(job.id))  # the cancel told it did the work
        with connection.pipeline() as pipe:
            if token is not None:
                pipe.hsetnx(job.key, keys.CANCELED_BY_FIELD, token)
            if execution is not None:
                execution.delete(job=job, pipeline=pipe)
            pipe.lrem(queue.intermediate_queue_key, 1, job.id)
            job.set_status(JobStatus.CANCELED, pipeline=pipe)
            CanceledJobRegistry(queue.name, connection=connection).add(job, pipeline=pipe)
            pipe.hset(job.key, mapping={"ended_at": utcformat(now()), "retries_left": 0})
            pipe.delete(keys.cancel_key(job.id))
            pipe.execute()

    until_reachable(write, "job_cancel_unrecorded")
    if webhooks is not None:
        bodies.keep_body(connection, job, "job.canceled", webhooks)
    log.info("job_canceled", job_id=job.id, queue=queue.name)
