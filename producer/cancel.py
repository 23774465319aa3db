"""Canceling a job: a queued one never runs, a running one stops at its next step.

The flag `cosyq:cancel:<id>` is set first, whatever the state, so a job that a worker pops in
the instant between our read and RQ's `Job.cancel()` is still stopped: the worker checks the
flag before it starts a job and at every piece or LLM step (workers/service/cancels.py). A
job still waiting (queued, scheduled for a retry, deferred) is then canceled with RQ's own
`Job.cancel()`: out of its queue and registries, status `canceled`, in the canceled registry.
A job that already ended is left exactly as it is. No worker ever sees a job canceled while
waiting, so its `job.canceled` webhook event (when it asked for one) is appended here, before
`Job.cancel()`, under the id a worker would give it (shared/job_events.py): told once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import redis
from rq.exceptions import InvalidJobOperation

from producer.tracking import JobTracker
from producer.webhooks.bodies import keep_body
from shared import keys
from shared.job_events import WebhookPolicy, job_ended

CancelVerdict = Literal["canceled", "stopping", "already_canceled", "already_ended"]
WAITING_STATES = frozenset({"queued", "scheduled", "deferred"})
ENDED_STATES = frozenset({"finished", "failed", "stopped"})


@dataclass(frozen=True)
class CancelOutcome:
    """What a cancel did: `canceled` (it will never run), `stopping` (running: it stops at its
    next step), `already_canceled`, or `already_ended` (`state` says how; nothing changed)."""

    job_id: str
    verdict: CancelVerdict
    state: str

    @property
    def changed(self) -> bool:
        return self.verdict in ("canceled", "stopping")

    def describe(self) -> str:
        return {
            "canceled": f"job {self.job_id} canceled (it was {self.state}; it will not run)",
            "stopping": f"job {self.job_id} is running: it stops at its next step",
            "already_canceled": f"job {self.job_id} was already canceled",
            "already_ended": f"job {self.job_id} already {self.state}: nothing changed",
        }[self.verdict]


def cancel_job(
    connection: redis.Redis,
    tracker: JobTracker,
    job_id: str,
    *,
    flag_ttl_s: int,
    webhooks: WebhookPolicy | None = None,
) -> CancelOutcome:
    """Cancel one job (see the module docstring); JobNotFoundError for an unknown id.
    `webhooks`: tell a waiting job's cancel to its webhook (None: the caller tells)."""
    job = tracker.fetch(job_id)
    raw = job.get_status(refresh=False)
    state = raw.value if raw is not None else "unknown"
    if state == "canceled":
        return CancelOutcome(job_id, "already_canceled", state)
    if state in ENDED_STATES:
        return CancelOutcome(job_id, "already_ended", state)
    connection.set(keys.cancel_key(job_id), "1", ex=flag_ttl_s)
    if state not in WAITING_STATES:  # started (or a state RQ adds later): the worker stops it
        return CancelOutcome(job_id, "stopping", state)
    if webhooks is not None:
        job_ended(connection, job, "job.canceled", webhooks)
    try:
        job.cancel()
    except InvalidJobOperation:  # canceled by someone else meanwhile
        return CancelOutcome(job_id, "already_canceled", "canceled")
    if webhooks is not None:
        keep_body(connection, job, "job.canceled", webhooks)
    return CancelOutcome(job_id, "canceled", state)
