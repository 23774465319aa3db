"""Retries with backoff, without RQ's scheduler process.

RQ retries a failed job that has `retries_left` by putting it in the queue's
ScheduledJobRegistry until its backoff interval passes; RQ's scheduler then moves it back to the
queue. That scheduler runs in a forked process, which Core ML/Metal workers must never do, so
each cosyq worker's housekeeping thread promotes due jobs itself. Promotion is lock-free: the
worker whose ZREM removes the entry enqueues the job.
"""

from __future__ import annotations

from collections.abc import Iterable

from redis import Redis
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.queue import Queue
from rq.registry import ScheduledJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import current_timestamp

from shared.jobs import retry_intervals
from workers.service.admission import CosyqJob

PROMOTE_BATCH = 100  # scheduled jobs moved per queue per housekeeping tick


def apply_default_retries(job: Job, *, max_retries: int, backoff_base_s: float) -> bool:
    """Give a job enqueued without a retry policy the configured one; True when changed."""
    if job.retries_left is not None:
        return False
    job.retries_left = max_retries
    job.retry_intervals = retry_intervals(max_retries, backoff_base_s)
    return True


def promote_due_retries(connection: Redis, queues: Iterable[Queue]) -> int:
    """Move scheduled jobs whose time has come back onto their queue; returns how many."""
    moved = 0
    for queue in queues:
        registry = ScheduledJobRegistry(queue=queue)
        for job_id in registry.get_jobs_to_schedule(current_timestamp(), PROMOTE_BATCH):
            if not connection.zrem(registry.key, job_id):
                continue  # another worker promoted it
            try:
                job = CosyqJob.fetch(job_id, connection=connection, serializer=JSONSerializer)
            except NoSuchJobError:
                continue
            queue.enqueue_job(job, at_front=job.should_enqueue_at_front())
            moved += 1
    return moved
