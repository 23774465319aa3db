"""The worker's one part in webhooks: an outbox entry when a job with a `webhook` ends for good.

Appended before RQ records the outcome, so a worker killed in between leaves an event whose job
is not done yet: the dispatcher waits for the job to end (the reaper's retry, or its failure)
before it sends anything. Never a network call to a receiver from here.
"""

from __future__ import annotations

from typing import Any

from rq.job import Job
from rq.utils import now, utcformat

from shared import keys
from shared.document_events import document_job_ended
from shared.logs import get_logger
from shared.webhooks import EventName, WebhookEvent, append_event, check_webhook_url

log = get_logger(__name__)


def webhook_url(job: Job, allowed: tuple[str, ...]) -> str | None:
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
        return check_webhook_url(url, allowed)
    except ValueError as e:
        log.warning("webhook_refused", job_id=job.id, reason=str(e))
        return None


def job_ended(connection: Any, job: Job, event: EventName, allowed: tuple[str, ...]) -> None:
    """Append `event` for `job` to the outbox when the job asked for an allowed webhook (a
    document's segment or assembly: the document's event instead, `shared.document_events`)."""
    if document_job_ended(connection, job, event, allowed):
        return
    url = webhook_url(job, allowed)
    if url is None:
        return
    attempt = job.meta.get(keys.ATTEMPT_META_KEY, 1)
    record = WebhookEvent.for_job(
        event, job.id, attempt if isinstance(attempt, int) else 1, url, utcformat(now())
    )
    append_event(connection, record)
    log.info("webhook_event_recorded", job_id=job.id, webhook_event=event)
