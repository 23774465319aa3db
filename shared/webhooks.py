"""A request's webhook: which URLs it may name, and the outbox event a worker appends.

The worker never calls a receiver: when a job ends for good it appends one small entry to the
Redis Stream `cosyq:webhooks:outbox` (in the same breath as its outcome), and a dispatcher
(`producer/webhooks/`) delivers it at least once. An event's webhook id is fixed when the event
is made (job id, event, attempt), so every redelivery carries the same `webhook-id` and a
receiver can drop duplicates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from shared import keys

JobOutcome = Literal["job.finished", "job.failed", "job.canceled"]
# A document's own events (shared/document_events.py): `job_id` is the document's id, and the
# outbox entry carries its body, made when the event is.
DocumentOutcome = Literal["document.finished", "document.failed", "document.canceled"]
EventName = JobOutcome | DocumentOutcome
EVENT_NAMES: tuple[EventName, ...] = (
    "job.finished",
    "job.failed",
    "job.canceled",
    "document.finished",
    "document.failed",
    "document.canceled",
)
MAX_WEBHOOK_URL_CHARS = 2048


class WebhookTarget(BaseModel):
    """`"webhook": {"url": "https://..."}` in a request."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(max_length=MAX_WEBHOOK_URL_CHARS)


def allowed_prefixes(raw: str | None) -> tuple[str, ...]:
    """COSYQ_WEBHOOK_ALLOWED_URLS split at commas."""
    return tuple(part.strip() for part in (raw or "").split(",") if part.strip())


def check_webhook_url(url: str, allowed: tuple[str, ...]) -> str:
    """The URL when it is an http(s) URL under an allowed prefix; ValueError saying why not."""
    if not allowed:
        raise ValueError("webhooks are not enabled here (COSYQ_WEBHOOK_ALLOWED_URLS is empty)")
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry a user name or password")
    if parts.fragment or not url.isprintable() or any(c.isspace() for c in url):
        raise ValueError("must have no fragment, spaces or control characters")
    if not any(url.startswith(prefix) for prefix in allowed):
        raise ValueError("not under any prefix of COSYQ_WEBHOOK_ALLOWED_URLS")
    return url


@dataclass(frozen=True)
class WebhookEvent:
    """One outbox entry: what ended, where to tell, and the id every delivery of it carries."""

    webhook_id: str
    event: EventName
    job_id: str
    url: str
    at: str  # ISO 8601 UTC, when the job ended

    @classmethod
    def for_job(
        cls, event: EventName, job_id: str, attempt: int, url: str, at: str
    ) -> WebhookEvent:
        return cls(f"msg_{job_id}_{event.split('.')[1]}_{attempt}", event, job_id, url, at)

    def fields(self) -> dict[str, str]:
        return {
            "webhook_id": self.webhook_id,
            "event": self.event,
            "job_id": self.job_id,
            "url": self.url,
            "at": self.at,
        }

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> WebhookEvent:
        event = next((name for name in EVENT_NAMES if name == fields["event"]), None)
        if event is None:
            raise ValueError(f"unknown webhook event {fields['event']!r}")
        return cls(fields["webhook_id"], event, fields["job_id"], fields["url"], fields["at"])


def append_event(connection: object, event: WebhookEvent) -> None:
    """XADD the event to the outbox (a redis client or pipeline). No MAXLEN: an entry leaves
    only once it was delivered or dead-lettered."""
    connection.xadd(keys.WEBHOOK_OUTBOX, event.fields())  # type: ignore[attr-defined]
