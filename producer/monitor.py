"""What `cosyq status` and `cosyq failed` show: queues, workers, failed jobs; and requeueing.

Reads only (no registry cleanup: a status command must not move jobs). Worker rows join RQ's own
worker registration with the stats each cosyq worker publishes in `cosyq:worker-stats:<name>`
(pid, rss_mb, jobs_done, state, current_job, backend, device, started_at); a worker that is still
loading its model has stats but no RQ registration yet, and is shown too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import redis
from rq import Queue, Worker
from rq.job import Job
from rq.registry import (
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)
from rq.serializers import JSONSerializer

from producer.tracking import failure_of
from shared import keys
from shared.results import JobFailure


@dataclass(frozen=True)
class QueueRow:
    name: str
    queued: int
    started: int
    scheduled: int  # waiting for a retry
    deferred: int
    finished: int
    failed: int


@dataclass(frozen=True)
class WorkerRow:
    name: str
    state: str
    current_job: str | None
    jobs_done: int | None
    rss_mb: float | None
    backend: str | None
    device: str | None
    pid: int | None
    started_at: str | None
    registered: bool  # known to RQ (False: starting up, or a stale stats entry)


@dataclass(frozen=True)
class FailedJob:
    job_id: str
    queue: str
    ended_at: datetime | None
    failure: JobFailure


def _queues(connection: redis.Redis, names: Sequence[str]) -> list[Queue]:
    return [Queue(name, connection=connection, serializer=JSONSerializer) for name in names]


def queue_rows(
    connection: redis.Redis, queue_names: Sequence[str] = keys.QUEUES_IN_PRIORITY_ORDER
) -> list[QueueRow]:
    """One row per queue (`queue_names`: every tenant's, shared.tenants.queue_names)."""
    rows = []
    for queue in _queues(connection, queue_names):
        counts = [
            registry(queue=queue, serializer=JSONSerializer).get_job_count(cleanup=False)
            for registry in (
                StartedJobRegistry,
                ScheduledJobRegistry,
                DeferredJobRegistry,
                FinishedJobRegistry,
                FailedJobRegistry,
            )
        ]
        rows.append(QueueRow(queue.name, queue.count, *counts))
    return rows


def _stats(connection: redis.Redis) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    for key in connection.scan_iter(match=keys.WORKER_STATS_PREFIX + "*", count=500):
        name = _text(key)[len(keys.WORKER_STATS_PREFIX) :]
        raw = connection.hgetall(key)
        found[name] = {_text(k): _text(v) for k, v in raw.items()}
    return found


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def worker_rows(connection: redis.Redis) -> list[WorkerRow]:
    stats = _stats(connection)
    rows = []
    for worker in Worker.all(connection=connection, serializer=JSONSerializer):
        own = stats.pop(worker.name, {})
        done = worker.successful_job_count + worker.failed_job_count
        rows.append(
            WorkerRow(
                name=worker.name,
                state=own.get("state") or worker.get_state(),
                current_job=own.get("current_job") or worker.get_current_job_id(),
                jobs_done=_int(own.get("jobs_done")) if "jobs_done" in own else done,
                rss_mb=_float(own.get("rss_mb")),
                backend=own.get("backend") or None,
                device=own.get("device") or None,
                pid=_int(own.get("pid")) or worker.pid,
                started_at=own.get("started_at") or _iso(worker.birth_date),
                registered=True,
            )
        )
    for name, own in stats.items():
        rows.append(_stats_only_row(name, own))
    return sorted(rows, key=lambda row: row.name)


def _stats_only_row(name: str, own: dict[str, str]) -> WorkerRow:
    return WorkerRow(
        name=name,
        state=own.get("state") or "?",
        current_job=own.get("current_job") or None,
        jobs_done=_int(own.get("jobs_done")),
        rss_mb=_float(own.get("rss_mb")),
        backend=own.get("backend") or None,
        device=own.get("device") or None,
        pid=_int(own.get("pid")),
        started_at=own.get("started_at") or None,
        registered=False,
    )


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def failed_jobs(
    connection: redis.Redis,
    limit: int | None = None,
    queue_names: Sequence[str] = keys.QUEUES_IN_PRIORITY_ORDER,
) -> list[FailedJob]:
    """Failed jobs of every queue, most recent first (up to `limit` in all)."""
    found: list[FailedJob] = []
    for queue in _queues(connection, queue_names):
        registry = FailedJobRegistry(queue=queue, serializer=JSONSerializer)
        end = -1 if limit is None else limit - 1
        for job_id in registry.get_job_ids(0, end, desc=True, cleanup=False):
            job = Job.fetch_many([job_id], connection=connection, serializer=JSONSerializer)[0]
            if job is None:
                continue  # expired between the two reads
            found.append(FailedJob(job_id, queue.name, job.ended_at, failure_of(job, "failed")))
    found.sort(key=lambda f: f.ended_at.timestamp() if f.ended_at else 0.0, reverse=True)
    return found if limit is None else found[:limit]


def requeue_failed(
    connection: redis.Redis,
    job_ids: Sequence[str] | None = None,
    queue_names: Sequence[str] = keys.QUEUES_IN_PRIORITY_ORDER,
) -> list[str]:
    """Put failed jobs back on their queues (all, or the given ids); returns those requeued."""
    wanted = set(job_ids) if job_ids else None
    requeued = []
    for queue in _queues(connection, queue_names):
        registry = FailedJobRegistry(queue=queue, serializer=JSONSerializer)
        for job_id in registry.get_job_ids(cleanup=False):
            if wanted is None or job_id in wanted:
                registry.requeue(job_id)
                requeued.append(job_id)
    return requeued
