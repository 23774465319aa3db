"""A job that ended while Redis was away: record its outcome when Redis is back, never rerun it.

The audio of a finished job is already stored when RQ writes the result, the status and the
registries. If Redis is unreachable at that moment the worker keeps the outcome in memory,
waits for Redis (its housekeeping thread keeps the job's heartbeat alive meanwhile, so no reaper
takes the job) and writes it then: one `job_outcome_unrecorded` line when it is lost, one
`job_outcome_recorded` when it went in.

If the attempt's bookkeeping failed at a step with nothing to keep (before the job ran), the
worker releases the job itself once Redis is back, labelled `outcome_unrecorded` (a retry, or
a failure when none is left), instead of leaving it to a reaper that would call it
`worker_died`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import cast

import redis
from rq.job import Job, JobStatus
from rq.queue import Queue
from rq.registry import StartedJobRegistry
from rq.utils import as_text, parse_composite_key

from producer.webhooks.bodies import keep_body
from shared.job_events import WebhookPolicy
from shared.logs import get_logger
from shared.webhooks import EventName
from workers.service.outage import REDIS_RETRY_FIRST_S, STOP_BOUND, refuse_or_wait
from workers.service.reaper import release_job

log = get_logger(__name__)

OUTCOME_RETRY_MAX_S = 2.0  # the heartbeat holds the job meanwhile: retry often, stay prompt
UNRECORDED_KIND = "outcome_unrecorded"


def record_ended(
    connection: redis.Redis,
    job: Job,
    write: Callable[[], None],
    event: EventName | None,
    webhooks: WebhookPolicy,
) -> None:
    """Run `write`, the job's outcome and its webhook `event` (None: it tells none, a retry),
    once Redis takes it (`when_reachable`), then keep the event's body for the dispatcher."""
    when_reachable(write, job_id=job.id, step="success" if event == "job.finished" else "failure")
    if event is not None:
        keep_body(connection, job, event, webhooks)


def when_reachable(action: Callable[[], None], *, job_id: str, step: str) -> None:
    """Run `action` (an outcome write); while Redis is unreachable, wait and run it again
    (after a warm stop, only until STOP_BOUND has passed).

    A misconfiguration or any other Redis error is raised (refuse_or_wait)."""
    delay, lost_at = REDIS_RETRY_FIRST_S, None
    while True:
        try:
            action()
        except redis.RedisError as e:
            refuse_or_wait(e)
            STOP_BOUND.check("job_outcome_unrecorded")  # a warm stop's wait is bounded
            if lost_at is None:
                lost_at = time.monotonic()
                log.warning("job_outcome_unrecorded", job_id=job_id, step=step, error=str(e))
            time.sleep(max(0.0, min(delay, STOP_BOUND.left_s())))
            delay = min(delay * 2, OUTCOME_RETRY_MAX_S)
            continue
        if lost_at is not None:
            waited = round(time.monotonic() - lost_at, 1)
            log.info("job_outcome_recorded", job_id=job_id, step=step, waited_s=waited)
        return


def already_finished(job: Job) -> bool:
    """True when a success write whose reply was lost did go in (EXEC ran before the drop)."""
    return job.get_status(refresh=True) == JobStatus.FINISHED


def release_unrecorded(
    connection: redis.Redis,
    queue: Queue,
    job: Job,
    worker: str,
    webhooks: WebhookPolicy | None = None,
) -> None:
    """Once Redis is back, give the job back (or fail it) as outcome_unrecorded, not
    worker_died; nothing to do when it never reached the started registry."""

    def release() -> None:
        registry_key = StartedJobRegistry(queue=queue).key
        for raw in connection.zrange(registry_key, 0, -1):
            entry = as_text(cast(bytes, raw))
            if parse_composite_key(entry)[0] == job.id:
                message = f"worker {worker} lost Redis before it could record this attempt"
                release_job(
                    connection,
                    queue,
                    entry,
                    kind=UNRECORDED_KIND,
                    message=message,
                    webhooks=webhooks,
                )

    when_reachable(release, job_id=job.id, step="release")
