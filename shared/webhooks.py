"""A request's webhook: which URLs it may name, and the outbox event a worker appends.

The worker never calls a receiver: when a job ends for good it appends one small entry to the
Redis Stream `cosyq:webhooks:outbox` (in the same breath as its outcome), and a dispatcher
(`producer/webhooks/`) delivers it at least once. An event's webhook id is fixed when the event
is made from what ended and how (`msg_<job id>_<finished|failed|canceled>`, `_r2`... added for a
job requeued by hand after it ended), never from the attempt: every redelivery, and a job that
ends twice (its worker killed after appending the event and before RQ recorded the outcome),
carries the same `webhook-id`, and the outbox takes one event per id (a marker kept
COSYQ_WEBHOOK_EVENT_MEMORY_HOURS), so a receiver is told once and can drop any duplicate that
at-least-once delivery brings.

An event names the tenant whose job ended; the dispatcher sends it only while that job, if it
is still in Redis, belongs to that tenant, and its body is that one job's status (kept when its
outcome was recorded: `producer/webhooks/bodies.py`), signed with that tenant's own
secret (`tenant_secret`): a tenant's receiver holds its secret, and one secret for all would let
any tenant sign events of its own making as another's.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import SplitResult, urlsplit

from pydantic import BaseModel, ConfigDict, Field

from shared import keys
from shared.webhook_addresses import check_address, checked_addresses, literal_address

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
DEFAULT_PORTS = {"http": 80, "https": 443}
SECRET_PREFIX = "whsec_"  # Standard Webhooks: the prefix, then the key in base64
_TENANT_SECRET_LABEL = "cosyq-webhook-secret:"  # what a tenant's key is derived for


def tenant_secret(secret: str, tenant: str) -> str:
    """The secret `tenant`'s events are signed with (what its receiver verifies with):
    COSYQ_WEBHOOK_SECRET itself for the tenant "default" (and an event of nobody's), else
    `whsec_` + base64 of HMAC-SHA256 over "cosyq-webhook-secret:<tenant>" keyed with that
    secret's key. Every dispatcher derives the same; no tenant's secret gives another's."""
    if tenant in ("", keys.DEFAULT_TENANT):
        return secret
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX) + "==")  # as Standard Webhooks
    label = (_TENANT_SECRET_LABEL + tenant).encode("utf-8")
    return SECRET_PREFIX + base64.b64encode(hmac.new(key, label, hashlib.sha256).digest()).decode()


class WebhookTarget(BaseModel):
    """`"webhook": {"url": "https://..."}` in a request."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(max_length=MAX_WEBHOOK_URL_CHARS)


def allowed_prefixes(raw: str | None) -> tuple[str, ...]:
    """COSYQ_WEBHOOK_ALLOWED_URLS split at commas."""
    return tuple(part.strip() for part in (raw or "").split(",") if part.strip())


def check_webhook_url(
    url: str, allowed: tuple[str, ...], *, allow_private: bool = False, resolve_names: bool = False
) -> str:
    """The URL when it is an http(s) URL under an allowed prefix whose host is a public
    address; ValueError saying why not.

    A literal address is judged here on both sides; a host name only with `resolve_names` (the
    producer, so the client learns at once; a name that does not resolve now passes, and the
    dispatcher, which judges every address it connects to, tries it later)."""
    if not allowed:
        raise ValueError("webhooks are not enabled here (COSYQ_WEBHOOK_ALLOWED_URLS is empty)")
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry a user name or password")
    if parts.fragment or not url.isprintable() or any(c.isspace() for c in url):
        raise ValueError("must have no fragment, spaces or control characters")
    if not any(_under_prefix(url, parts, prefix) for prefix in allowed):
        raise ValueError("not under any prefix of COSYQ_WEBHOOK_ALLOWED_URLS")
    if not allow_private:
        _check_host(parts.hostname, parts, resolve_names=resolve_names)
    return url


def _origin(parts: SplitResult) -> tuple[str, str, int | None]:
    """Scheme, host and port (the scheme's own when none is written): what a request reaches."""
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or DEFAULT_PORTS.get(scheme)


def _under_prefix(url: str, parts: SplitResult, prefix: str) -> bool:
    """`url` starts with `prefix` and reaches the same scheme, host and port: a prefix written
    without its path's slash (`https://hooks.example.com`) must not admit
    `https://hooks.example.com.evil.net/` or `https://hooks.example.com:8443/`. A prefix of a
    scheme alone (`https://`) admits any host."""
    if not url.startswith(prefix):
        return False
    allowed = urlsplit(prefix)
    if not allowed.netloc:  # "https://": any host, as written
        return True
    try:
        return _origin(parts) == _origin(allowed)
    except ValueError:  # a port that is no number: that prefix admits nothing
        return False


def _check_host(host: str, parts: SplitResult, *, resolve_names: bool) -> None:
    literal = literal_address(host)
    if literal is not None:
        check_address(host, literal)
    elif resolve_names:
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
            checked_addresses(host, port, allow_private=False)
        except OSError:
            return  # not resolvable now: the dispatcher judges it when it connects


@dataclass(frozen=True)
class WebhookEvent:
    """One outbox entry: what ended, whose it is, where to tell, and the id every delivery of
    it carries (`webhook_id`: one per job and outcome)."""

    webhook_id: str
    event: EventName
    job_id: str
    url: str
    at: str  # ISO 8601 UTC, when the job ended
    tenant: str = ""  # the tenant whose job it is; "" (an old entry): nobody's, never sent

    @classmethod
    def for_job(
        cls, event: EventName, job_id: str, url: str, at: str, tenant: str, *, run: int = 1
    ) -> WebhookEvent:
        return cls(event_id(job_id, event, run), event, job_id, url, at, tenant)

    def fields(self) -> dict[str, str]:
        return {
            "webhook_id": self.webhook_id,
            "event": self.event,
            "job_id": self.job_id,
            "url": self.url,
            "at": self.at,
            "tenant": self.tenant,
        }

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> WebhookEvent:
        event = next((name for name in EVENT_NAMES if name == fields["event"]), None)
        if event is None:
            raise ValueError(f"unknown webhook event {fields['event']!r}")
        return cls(
            fields["webhook_id"],
            event,
            fields["job_id"],
            fields["url"],
            fields["at"],
            fields.get("tenant", ""),
        )


def event_id(subject_id: str, event: str, run: int = 1) -> str:
    """The webhook id of one outcome of one job (or document): `msg_<id>_<outcome>`, and
    `_r<run>` for a job that ended and was requeued by hand (its next end is news)."""
    suffix = f"_r{run}" if run > 1 else ""
    return f"msg_{subject_id}_{event.rsplit('.', 1)[1]}{suffix}"


# One event per webhook id: the marker and the XADD in one step, so a job that ends twice
# (its worker killed between the two writes of its outcome) is told once; and in the same step
# the event is noted as having no body kept yet (ZADD, scored by when it was appended).
_APPEND_ONCE = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', tonumber(ARGV[1])) then return 0 end
redis.call('ZADD', KEYS[3], tonumber(ARGV[2]), ARGV[3])
redis.call('XADD', KEYS[2], '*', unpack(ARGV, 4))
return 1
"""


def append_event(connection: Any, event: WebhookEvent, *, memory_s: int) -> None:
    """XADD the event to the outbox (a redis client or pipeline) unless an event with its id
    was appended in the last `memory_s` seconds. No MAXLEN: an entry leaves only once it was
    delivered or dead-lettered. The event is noted unkept (`keys.WEBHOOK_UNKEPT`) until its
    body is kept: when its recorder dies before keeping it, the workers' housekeeping keeps it
    (`workers.service.webhook_bodies`)."""
    flat = [part for pair in event.fields().items() for part in pair]
    marker = keys.WEBHOOK_EVENT_SEEN_PREFIX + event.webhook_id
    key_names = (marker, keys.WEBHOOK_OUTBOX, keys.WEBHOOK_UNKEPT)
    connection.eval(
        _APPEND_ONCE, 3, *key_names, max(1, memory_s), time.time(), unkept_member(event), *flat
    )


def unkept_member(event: WebhookEvent) -> str:
    """The event's entry in `keys.WEBHOOK_UNKEPT`: what keeping its body needs (its id, job,
    outcome and tenant; never when it was made, so whoever keeps the body finds the entry)."""
    fields = {"webhook_id": event.webhook_id, "event": event.event, "job_id": event.job_id}
    return json.dumps(fields | {"tenant": event.tenant}, sort_keys=True)
