"""A job's webhook event: one outbox entry when a job with a `webhook` ends for good.

Appended before the outcome is recorded, by whoever records it: the worker (finished, failed,
canceled; `workers/worker.py`), the reaper (in the failure's transaction) and
the producer's `cancel` of a waiting job, which no worker ever sees (RQ's `Job.cancel()` takes it
out of its queue). A worker killed in between leaves an event whose job is not done yet: the
dispatcher waits for the job to end before it sends anything. Once the outcome is recorded, the
same recorder keeps the event's body (`producer/webhooks/bodies.py`, from `job_event`'s webhook
id), so the event outlives its job. Never a network call to a receiver from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rq.job import Job
from rq.utils import now, utcformat

from shared import keys
from shared.document_events import document_job_ended, document_place
from shared.logs import get_logger
from shared.settings import Settings
from shared.tenants import TENANT_META_KEY
from shared.webhooks import (
    EventName,
    WebhookEvent,
    allowed_prefixes,
    append_event,
    check_webhook_url,
)

log = get_logger(__name__)


def webhook_url(job: Job, policy: WebhookPolicy, *, quiet: bool = False) -> str | None:
    """The request's webhook URL when this worker's allow-list takes it, else None.

    Checked here again: a job that failed validation ends through here too, and the queue is
    never trusted.
    """
    if job.func_name != keys.SYNTHESIZE_FUNCTION:
        return None
    request: Any = (job.kwargs or {}).get("request")
    target = request.get("webhook") if isinstance(request, dict) else None
    url = target.get("url") if isinstance(target, dict) else None
    if not isinstance(url, str):
        return None
    try:
        return check_webhook_url(url, policy.allowed, allow_private=policy.allow_private)
    except ValueError as e:
        if not quiet:
            log.warning("webhook_refused", job_id=job.id, reason=str(e))
        return None


@dataclass(frozen=True)
class WebhookPolicy:
    """What a worker needs to record events: the URL allow-list and how long an event's id is
    remembered (COSYQ_WEBHOOK_ALLOWED_URLS, COSYQ_WEBHOOK_EVENT_MEMORY_HOURS)."""

    allowed: tuple[str, ...] = ()
    memory_s: int = 72 * 3600
    allow_private: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> WebhookPolicy:
        memory_s = int(settings.webhook_event_memory_hours * 3600)
        allowed = allowed_prefixes(settings.webhook_allowed_urls)
        return cls(allowed, memory_s, settings.webhook_allow_private)


def job_ended(connection: Any, job: Job, event: EventName, policy: WebhookPolicy) -> None:
    """Append `event` for `job` to the outbox when the job asked for an allowed webhook (a
    client or a pipeline: the reaper records it with the failure, in one transaction)."""
    if not policy.allowed:
        return
    if document_job_ended(connection, job, event, policy.allowed, policy.allow_private):
        return  # a document's segment or assembly: the document's event instead
    record = job_event(job, event, policy)
    if record is None:
        return
    append_event(connection, record, memory_s=policy.memory_s)
    log.info("webhook_event_recorded", job_id=job.id, webhook_event=event)


def job_event(
    job: Job, event: EventName, policy: WebhookPolicy, *, quiet: bool = False
) -> WebhookEvent | None:
    """The event `job` ending as `event` makes (its webhook id, URL and tenant, `at` now); None
    when it asked for no allowed webhook, has no tenant tag, or is a document's job (the
    document tells). Reads nothing from Redis; `quiet`: a refusal is not logged (again)."""
    if not policy.allowed or document_place(job) is not None:
        return None
    url = webhook_url(job, policy, quiet=quiet)
    if url is None:
        return None
    tenant = job.meta.get(TENANT_META_KEY)
    if not isinstance(tenant, str):  # no tag (its hash re-made without meta): nobody's
        if not quiet:
            log.warning("webhook_refused", job_id=job.id, reason="the job has no tenant tag")
        return None
    run = job.meta.get(keys.RUN_META_KEY, 1)
    run = run if isinstance(run, int) else 1
    return WebhookEvent.for_job(event, job.id, url, utcformat(now()), tenant, run=run)
