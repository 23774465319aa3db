"""The fleet view's data: queues by priority and tenant, workers (running and recently
stopped), throughput per minute over the last hour, and recent failures by kind.

A tenant key sees its own queues, throughput and failures, and each worker's state and memory
(the fleet's health); a worker's current job id and its jobs done (every tenant's, summed) are
shown to operators only."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import redis
from rq.job import Job
from rq.registry import FailedJobRegistry
from rq.serializers import JSONSerializer

from producer.monitor import QueueRow, queue_rows
from producer.tracking import failure_of, tenant_of_job
from shared import keys, tenants
from shared.job_index import Minute, stopped_workers, throughput
from shared.settings import Settings

RECENT_FAILURES = 200  # failures by kind: the latest this many of each visible queue
CHART_W, CHART_H = 600, 90  # the throughput chart's SVG size


@dataclass(frozen=True)
class WorkerView:
    name: str
    host: str
    state: str
    jobs_done: int | None
    rss_mb: float | None
    next_recycle: int | None  # jobs left before it recycles (COSYQ_MAX_JOBS, jitter aside)
    current_job: str
    started_at: str
    stopped_at: float | None


@dataclass(frozen=True)
class Fleet:
    queues: list[QueueRow]
    workers: list[WorkerView]
    minutes: list[Minute]
    failures: list[tuple[str, int]]  # (kind, count), most first
    jobs_path: str  # SVG polyline points: jobs per minute
    audio_path: str  # SVG polyline points: audio seconds per wall second
    peak_jobs: int
    peak_rate: float


def fleet(connection: redis.Redis, settings: Settings, tenant: str | None) -> Fleet:
    """`tenant` None: an operator (every queue); else that tenant's queues only."""
    names = (
        tenants.queue_names(settings.tenant_names())
        if tenant is None
        else tenants.tenant_queues(tenant)
    )
    minutes = throughput(connection, tenant)  # an operator's: the fleet's
    rates = [m.audio_s / 60.0 for m in minutes]
    jobs = [float(m.jobs) for m in minutes]
    return Fleet(
        queues=queue_rows(connection, names),
        workers=workers(connection, settings, operator=tenant is None),
        minutes=minutes,
        failures=failures_by_kind(connection, names, tenant),
        jobs_path=_points(jobs),
        audio_path=_points(rates),
        peak_jobs=int(max(jobs, default=0)),
        peak_rate=max(rates, default=0.0),
    )


def _points(values: list[float]) -> str:
    top = max(values, default=0.0) or 1.0
    step = CHART_W / max(1, len(values) - 1)
    return " ".join(
        f"{i * step:.1f},{CHART_H - value / top * (CHART_H - 4):.1f}"
        for i, value in enumerate(values)
    )


def workers(connection: redis.Redis, settings: Settings, *, operator: bool) -> list[WorkerView]:
    """Every worker's published stats (cosyq:worker-stats:*), then those stopped lately."""
    found = []
    for key in connection.scan_iter(match=keys.WORKER_STATS_PREFIX + "*", count=500):
        stats = {_text(k): _text(v) for k, v in connection.hgetall(key).items()}
        if stats:
            found.append(_view(stats, settings, operator=operator, stopped_at=None))
    found.sort(key=lambda w: w.name)
    for stats in stopped_workers(connection):
        stopped_at = stats.get("stopped_at")
        at = float(stopped_at) if isinstance(stopped_at, int | float) else None
        flat = {k: str(v) for k, v in stats.items()}
        found.append(_view(flat, settings, operator=operator, stopped_at=at))
    return found


def _view(
    stats: dict[str, str], settings: Settings, *, operator: bool, stopped_at: float | None
) -> WorkerView:
    # A worker's jobs done sums every tenant's jobs: a tenant would subtract its own and
    # learn the others' count (as from a total on /metrics). Operators only, as the job.
    done = _number(stats.get("jobs_done")) if operator else None
    running = stopped_at is None
    return WorkerView(
        name=stats.get("name", "?"),
        host=stats.get("host", ""),
        state=stats.get("state", "?"),
        jobs_done=None if done is None else int(done),
        rss_mb=_number(stats.get("rss_mb")),
        next_recycle=max(0, settings.max_jobs - int(done))
        if running and done is not None
        else None,
        current_job=stats.get("current_job", "") if operator else "",
        started_at=stats.get("started_at", ""),
        stopped_at=stopped_at,
    )


def failures_by_kind(
    connection: redis.Redis, names: tuple[str, ...], tenant: str | None
) -> list[tuple[str, int]]:
    counts: Counter[str] = Counter()
    for name in names:
        registry = FailedJobRegistry(name, connection=connection, serializer=JSONSerializer)
        ids = registry.get_job_ids(0, RECENT_FAILURES - 1, desc=True, cleanup=False)
        for job in Job.fetch_many(ids, connection=connection, serializer=JSONSerializer):
            if job is not None and (tenant is None or tenant_of_job(job) == tenant):
                counts[failure_of(job, "failed").kind] += 1
    return counts.most_common()


def _number(value: Any) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
