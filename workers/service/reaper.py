"""No job lost: give back (or fail) the jobs of workers that died mid-job.

A SimpleWorker killed mid-job (SIGKILL, OOM, a native crash) leaves its job STARTED in RQ's
StartedJobRegistry until job timeout + 60 s, and RQ's own cleanup runs every 10 minutes. cosyq
does better with a per-job heartbeat: while a job runs, its worker keeps
`cosyq:job-heartbeat:<job id>` (value: the worker name) alive with a short TTL. A started entry
whose heartbeat key is gone belongs to a dead worker. Every worker (at start-up and every
heartbeat interval) and the pool run this reaper, so it works under launchd and supervisord too.

Ordering that makes "no heartbeat" mean "dead": a worker sets the heartbeat key before RQ adds
the job to the started registry, and deletes it only after RQ removed the entry. Reapers race
safely: whoever removes the registry entry (ZREM returns 1) owns the job.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, cast

from redis import Redis, RedisError
from rq.exceptions import NoSuchJobError
from rq.executions import Execution
from rq.job import Job, JobStatus
from rq.job_lifecycle import record_job_failure
from rq.queue import Queue
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import as_text, now, parse_composite_key
from rq.worker import SimpleWorker

from producer.webhooks.bodies import keep_body
from shared import keys
from shared.job_events import WebhookPolicy, job_ended
from shared.logs import get_logger
from workers.service.admission import CosyqJob
from workers.service.audio_stream import end_released_stream

log = get_logger(__name__)

Outcome = Literal["retried", "failed"]


@dataclass(frozen=True)
class ReapedJob:
    job_id: str
    queue: str
    worker_name: str
    outcome: Outcome


class Reaper:
    """Finds started jobs without a live heartbeat on some queues and releases them."""

    def __init__(
        self,
        connection: Redis,
        queue_names: Iterable[str],
        *,
        heartbeat_ttl_s: float,
        webhooks: WebhookPolicy | None = None,
    ):
        self.connection = connection
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.webhooks = webhooks
        self.queues = [
            Queue(name, connection=connection, job_class=CosyqJob, serializer=JSONSerializer)
            for name in queue_names
        ]
        self._outage_seen = False
        self._quiet_until: float | None = None

    def reap(self, dead_worker: str | None = None) -> list[ReapedJob]:
        """Release every started job whose heartbeat expired (or names `dead_worker`).

        After this reaper saw Redis fail, heartbeats are not trusted for one TTL once Redis
        answers again: keys expired during the outage, and live workers (one still writing a
        finished job's outcome, say) need that long to claim theirs again."""
        try:
            if dead_worker is None and self._quiet_after_outage():
                return []
            return self._release(dead_worker)
        except RedisError:
            self._outage_seen, self._quiet_until = True, None
            raise

    def _quiet_after_outage(self) -> bool:
        if self._outage_seen:
            self.connection.ping()
            self._outage_seen = False
            self._quiet_until = time.monotonic() + self.heartbeat_ttl_s
        return self._quiet_until is not None and time.monotonic() < self._quiet_until

    def _release(self, dead_worker: str | None) -> list[ReapedJob]:
        reaped = []
        for queue in self.queues:
            registry_key = StartedJobRegistry(queue=queue).key
            for raw in self.connection.zrange(registry_key, 0, -1):
                entry = as_text(cast(bytes, raw))
                job_id, _ = parse_composite_key(entry)
                holder = self.connection.get(keys.job_heartbeat_key(job_id))
                holder_name = as_text(holder) if holder is not None else None
                if holder_name is not None and holder_name != dead_worker:
                    continue
                message = self._died_message(holder_name)
                result = release_job(
                    self.connection,
                    queue,
                    entry,
                    kind="worker_died",
                    message=message,
                    webhooks=self.webhooks,
                )
                if result is not None:
                    reaped.append(result)
        return reaped

    def _died_message(self, holder: str | None) -> str:
        if holder is not None:
            return f"worker died: worker {holder} exited while running this job"
        return f"worker died: no heartbeat for {self.heartbeat_ttl_s:g} s while running this job"


def release_job(
    connection: Redis,
    queue: Queue,
    entry: str,
    *,
    kind: str,
    message: str,
    webhooks: WebhookPolicy | None = None,
) -> ReapedJob | None:
    """Take one started entry away from its (dead or stopping) worker: retry or fail the job.
    A failed job's `job.failed` event (when it asked for a webhook) is recorded with the failure.

    Returns None when another reaper got there first or the job already finished.
    """
    registry_key = StartedJobRegistry(queue=queue).key
    if not connection.zrem(registry_key, entry):
        return None  # another reaper (or the worker itself) removed it first
    job_id, execution_id = parse_composite_key(entry)
    try:
        job = CosyqJob.fetch(job_id, connection=connection, serializer=JSONSerializer)
    except NoSuchJobError:
        return None
    if not _still_claimed(connection, queue, job):
        return None
    worker_name = job.worker_name or ""
    error = {"kind": kind, "message": message}
    retry = bool(job.retries_left and job.retries_left > 0)
    # The stream's error entry first: a reader that sees the job failed finds it there.
    _end_stream(connection, job, kind=kind, message=message, retry=retry)
    with connection.pipeline() as pipe:
        _forget_execution(connection, job, execution_id, pipe)
        if not retry:
            job.meta[keys.ERROR_META_KEY] = error
            job.ended_at = now()
            record_job_failure(job, message, pipe)
            pipe.hset(job.key, "meta", json.dumps(job.meta))
            if webhooks is not None:
                job_ended(pipe, job, "job.failed", webhooks)
        pipe.execute()
    if webhooks is not None and not retry:
        keep_body(connection, job, "job.failed", webhooks)
    outcome: Outcome = "failed"
    if retry:
        # After the pipeline: RQ's enqueue WATCHes dependencies, so it cannot join one.
        job.retries_left = (job.retries_left or 1) - 1
        job.meta[keys.LAST_ERROR_META_KEY] = error
        queue.enqueue_job(job, at_front=True)
        outcome = "retried"
    log.warning(
        "job_released",
        job_id=job_id,
        queue=queue.name,
        worker=worker_name,
        outcome=outcome,
        reason=kind,
    )
    return ReapedJob(job_id=job_id, queue=queue.name, worker_name=worker_name, outcome=outcome)


def _end_stream(connection: Redis, job: Job, *, kind: str, message: str, retry: bool) -> None:
    """A streamed job's readers learn at once that this attempt ended (before any retry
    restarts the stream); best effort: the job's own outcome is already recorded."""
    request = job.kwargs.get("request") if isinstance(job.kwargs, dict) else None
    if retry:
        message += "; the job was requeued and its next attempt restarts the stream"
    try:
        end_released_stream(
            connection, job.id, request, kind=kind, message=message, ttl_s=job.result_ttl
        )
    except (RedisError, ValueError, KeyError) as e:
        log.warning("stream_error_entry_lost", job_id=job.id, error=str(e))


def _still_claimed(connection: Redis, queue: Queue, job: Job) -> bool:
    """True for a job its worker took and never finished.

    STARTED is the usual case; QUEUED with a started entry means the worker died between
    registering the execution and marking the job started (unless it is back in the queue).
    """
    status = job.get_status(refresh=False)
    if status == JobStatus.STARTED:
        return True
    return status == JobStatus.QUEUED and connection.lpos(queue.key, job.id) is None


def _forget_execution(connection: Redis, job: Job, execution_id: str, pipe: object) -> None:
    """Delete the dead execution's hash and index entries (RQ's own cleanup would, much later)."""
    execution = Execution(id=execution_id, job_id=job.id, connection=connection)
    data = connection.hgetall(execution.key)
    if data:
        execution.restore(data)
    execution.worker_name = execution.worker_name or (job.worker_name or "")
    execution.delete(job=job, pipeline=pipe)  # type: ignore[arg-type]


def forget_worker(connection: Redis, worker_name: str) -> None:
    """Deregister a worker known to be dead (RQ would list it until its key expired)."""
    connection.delete(keys.worker_stats_key(worker_name))
    key = SimpleWorker.redis_worker_namespace_prefix + worker_name
    worker = SimpleWorker.find_by_key(key, connection=connection, serializer=JSONSerializer)
    if worker is not None:
        worker.register_death()
