"""The webhook dispatcher: reads the outbox as one consumer of the dispatchers' group, delivers
each event at least once, retries with backoff for COSYQ_WEBHOOK_RETRY_HOURS, then dead-letters.

Runs as `cosyq webhooks run` or inside `cosyq serve` (COSYQ_WEBHOOK_DISPATCH_IN_SERVE); any
number of them share the work through the consumer group. Deliveries run on a small thread pool,
each within one deadline (COSYQ_WEBHOOK_TIMEOUT_S, the whole request), and one receiver (a URL's
scheme, host and port) holds at most COSYQ_WEBHOOK_RECEIVER_CONCURRENCY of the slots (its other
events wait in the retry set, no try counted), so a slow or dead receiver never delays a worker
(workers only append to the outbox) or the other receivers. An entry this dispatcher is
delivering is never taken back by it.

An event is sent only while its job, if it is still in Redis, belongs to the event's tenant,
and its body is that one job's status, kept by whoever recorded its outcome (`bodies.py`: so it
outlives the job), else read at the first try: a job whose hash was re-made (no tenant, or
another one) is dead-lettered, unsent, and so is any event naming no tenant (a document's
planned before tenants: nobody's).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from urllib.parse import urlsplit

import redis

from producer.tracking import TERMINAL_STATES, JobTracker
from producer.webhooks.bodies import (
    event_body,
    kept_body,
    settle,
    spend,
    tells,
    told_otherwise,
    was_sent,
)
from producer.webhooks.delivery import Sender
from producer.webhooks.forget import was_erased
from producer.webhooks.records import Answer, Delivery
from producer.webhooks.store import Entry, WebhookStore
from shared.connection import settings_error
from shared.errors import JobNotFoundError, SettingsError
from shared.logs import get_logger
from shared.settings import Settings
from shared.settings_env import redact_urls
from shared.webhooks import WebhookEvent

log = get_logger(__name__)

OUTAGE_PAUSE_MAX_S = 10.0
BOOKING_PAUSE_S = 0.2  # between tries to book an answered delivery while Redis is away

BodyOf = Callable[[WebhookEvent], str | None]  # the JSON body, None while it is not done


class EventUnsendable(Exception):
    """An event that must never be sent (its job is gone, or is not the event tenant's)."""


class EventErased(Exception):
    """An event of a job or document erased since it was made (producer/webhooks/forget.py):
    dropped, never sent."""


class EventSuperseded(Exception):
    """A job event whose job ended otherwise: its worker appended it and died before RQ
    recorded that end, and the job then ended another way (the reaper failed it, a cancel won),
    whose own event tells the one outcome. Dropped, never sent: not an outcome at all."""


def consumer_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


class WebhookDispatcher:
    """Delivers the outbox. `run(stop)` returns once `stop` is set and in-flight tries ended."""

    def __init__(
        self, connection: redis.Redis, settings: Settings, *, body_of: BodyOf | None = None
    ) -> None:
        if settings.webhook_secret is None:
            raise SettingsError("COSYQ_WEBHOOK_SECRET: required to sign webhooks (whsec_...)")
        self.settings = settings
        self.store = WebhookStore(connection)
        self.connection = connection
        self.sender = Sender(
            settings.webhook_secret.get_secret_value(),
            timeout_s=settings.webhook_timeout_s,
            allow_private=settings.webhook_allow_private,
            connections=settings.webhook_concurrency,
        )
        tracker = JobTracker(connection, settings)
        memory_s = int(settings.webhook_event_memory_hours * 3600)
        self.body_of = body_of or (lambda event: job_body(tracker, event, memory_s))
        self.consumer = consumer_name()
        # longest one read of the outbox waits: how soon a stop or a due retry is noticed
        self.read_block_ms = max(1, round(settings.webhook_poll_s * 1000))
        self.in_flight: dict[Future[None], tuple[str, str]] = {}  # -> (entry id, receiver)
        self.stop = threading.Event()  # run's own, once it runs

    def run(self, stop: threading.Event) -> None:
        self.stop = stop
        slots = self.settings.webhook_concurrency
        pause = 0.5
        with ThreadPoolExecutor(slots, "cosyq-webhook") as pool:
            self._ensure_group(stop)
            while not stop.is_set():
                self.in_flight = {f: v for f, v in self.in_flight.items() if not f.done()}
                free = slots - len(self.in_flight)
                if free == 0:
                    wait(self.in_flight, self.read_block_ms / 1000, return_when=FIRST_COMPLETED)
                    continue
                try:
                    for entry in self._next(free):
                        self._start(pool, entry)
                    pause = 0.5
                except redis.ConnectionError as e:  # an outage: wait it out
                    self._raise_if_refused(e)
                    log.warning("webhook_outbox_unreachable", error=str(e), retry_in_s=pause)
                    stop.wait(pause)
                    pause = min(pause * 2, OUTAGE_PAUSE_MAX_S)
                except Exception as e:  # the outbox deleted (NOGROUP), a bug: never die quietly
                    self._raise_if_refused(e)
                    log.error(
                        "webhook_dispatch_failed",
                        error_type=type(e).__name__,
                        error=redact_urls(str(e)),
                        retry_in_s=pause,
                    )
                    stop.wait(pause)
                    pause = min(pause * 2, OUTAGE_PAUSE_MAX_S)
                    self._ensure_group(stop)
        self.sender.close()

    def _start(self, pool: ThreadPoolExecutor, entry: Entry) -> None:
        """Deliver `entry` on a free slot, or, when its receiver already holds its share of
        the slots, put it in the retry set for a while (no try counted)."""
        entry_id, fields = entry
        receiver = _receiver_of(fields)
        busy = sum(1 for _, held in self.in_flight.values() if held == receiver)
        if receiver and busy >= self.settings.webhook_receiver_concurrency:
            waiting = _placeholder(fields)
            self.store.retry_later(entry_id, waiting, time.time() + self.settings.webhook_backoff_s)
            return
        self.in_flight[pool.submit(self.handle, entry)] = (entry_id, receiver)

    def _ensure_group(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.store.ensure_group()
                return
            except redis.RedisError as e:  # away, or the key not a stream: tried again
                self._raise_if_refused(e)
                log.warning("webhook_outbox_unreachable", error=str(e), error_type=type(e).__name__)
                stop.wait(1.0)

    def _raise_if_refused(self, error: Exception) -> None:
        """A wrong password, ACL, TLS certificate or another service's port is a setting to fix,
        never an outage to wait out: the dispatcher ends with one line (`cosyq webhooks run`
        exits 2)."""
        problem = settings_error(error, self.settings)
        if problem is not None:
            raise problem from error

    def _next(self, count: int) -> list[Entry]:
        now = time.time()
        self.store.promote_due(now, count)
        self.store.drop_old_dead(now - self.settings.failure_ttl_s, count)
        idle_ms = int(self.settings.webhook_claim_idle_s * 1000)
        mine = {entry_id for entry_id, _ in self.in_flight.values()}
        entries = [
            entry
            for entry in self.store.claim_stale(self.consumer, idle_ms, count)
            if entry[0] not in mine  # in flight here: never taken back from itself
        ]
        return entries or self.store.read_new(self.consumer, count, self.read_block_ms)

    def handle(self, entry: Entry) -> None:
        """One try of one outbox entry, and its move to delivered, retry or dead. The delivery
        thread's boundary: an error nobody foresaw is logged here, once, and counts as a failed
        try (retried with backoff, dead-lettered after COSYQ_WEBHOOK_RETRY_HOURS); when even
        that cannot be booked (Redis away) the entry stays pending, claimed again after
        COSYQ_WEBHOOK_CLAIM_IDLE_S."""
        try:
            self._try(entry)
        except Exception as e:
            self._crashed(entry, e)

    def _crashed(self, entry: Entry, error: Exception) -> None:
        entry_id, fields = entry
        kind, message = type(error).__name__, redact_urls(str(error))
        log.error(
            "webhook_delivery_crashed",
            webhook_id=fields.get("webhook_id"),
            entry_id=entry_id,
            error_type=kind,
            error=message,
        )
        try:
            failed = Answer(False, f"delivery crashed: {kind}: {message}")
            self._later(entry_id, _placeholder(fields), failed)
        except Exception as e:  # booked nowhere: left pending, claimed again
            log.warning(
                "webhook_crash_unbooked",
                entry_id=entry_id,
                error_type=type(e).__name__,
                error=redact_urls(str(e)),
            )

    def _try(self, entry: Entry) -> None:
        entry_id, fields = entry
        try:
            delivery = self._delivery(fields)
        except (KeyError, ValueError) as e:
            log.error("webhook_entry_unreadable", entry_id=entry_id, error=str(e))
            record = json.dumps({"fields": fields, "error": f"unreadable entry: {e}"})
            self.store.dead(entry_id, fields.get("webhook_id", entry_id), record)
            return
        except EventUnsendable as e:
            return self._dead(entry_id, _placeholder(fields), str(e))
        except EventSuperseded as e:
            log.warning("webhook_superseded", webhook_id=fields.get("webhook_id"), reason=str(e))
            return self.store.delivered(entry_id)  # off the books: the job's own end tells
        except EventErased:
            log.info("webhook_erased", webhook_id=fields.get("webhook_id"))
            return self.store.delivered(entry_id)  # off the books: its subject was erased
        if not delivery.body:  # the job has not ended yet: look again after a pause
            return self._later(entry_id, delivery, Answer(False, "job not done yet"))
        answer = self.sender.send(delivery)
        if answer.delivered:
            self._book_delivered(entry_id)
            log.info(
                "webhook_delivered", webhook_id=delivery.event.webhook_id, tries=delivery.tries + 1
            )
            self._spend(delivery)
        elif answer.permanent:
            self._dead(entry_id, delivery.failed(answer.error), answer.error)
        else:
            self._later(entry_id, delivery, answer)

    def _book_delivered(self, entry_id: str) -> None:
        """Book a delivery the receiver took, waiting out a Redis outage (until the dispatcher
        stops): left pending, the entry would be claimed again and sent to a receiver that
        already acknowledged it. Tried every BOOKING_PAUSE_S, so that it is booked as soon as
        Redis is back, before another dispatcher can claim the entry."""
        while True:
            try:
                return self.store.delivered(entry_id)
            except redis.ConnectionError as e:
                if self.stop.is_set():
                    raise
                log.warning("webhook_booking_waits", entry_id=entry_id, error=str(e))
                self.stop.wait(BOOKING_PAUSE_S)

    def _spend(self, delivery: Delivery) -> None:
        """A job event's kept body gives way to the marker of one sent (best effort: left, it
        only holds its bytes until COSYQ_WEBHOOK_EVENT_MEMORY_HOURS ends)."""
        try:
            spend(self.connection, delivery.event)
        except redis.RedisError as e:
            log.warning("webhook_body_unspent", webhook_id=delivery.event.webhook_id, error=str(e))

    def _delivery(self, fields: dict[str, str]) -> Delivery:
        """The entry as a Delivery, its body taken on the first try (kept, else built;
        EventUnsendable: never, also for an event naming no tenant that came with its body: a
        document's of nobody's)."""
        delivery = _placeholder(fields)
        if not delivery.event.tenant:
            raise EventUnsendable("the event names no tenant: nobody's, never sent")
        if was_erased(self.store.connection, delivery.event.webhook_id):
            raise EventErased(delivery.event.webhook_id)
        if delivery.body:
            return delivery
        body = self.body_of(delivery.event)
        return Delivery(delivery.event, body or "", delivery.tries, delivery.first_try_at)

    def _later(self, entry_id: str, delivery: Delivery, answer: Answer) -> None:
        failed = delivery.failed(answer.error)
        age = time.time() - delivery.first_try_at
        if age >= self.settings.webhook_retry_hours * 3600:
            return self._dead(
                entry_id, failed, f"gave up after {failed.tries} tries: {answer.error}"
            )
        pause = min(
            self.settings.webhook_backoff_s * 2 ** (failed.tries - 1),
            self.settings.webhook_backoff_max_s,
        )
        log.warning(
            "webhook_try_failed",
            webhook_id=delivery.event.webhook_id,
            tries=failed.tries,
            error=answer.error,
            retry_in_s=round(pause, 3),
        )
        self.store.retry_later(entry_id, failed, time.time() + pause)

    def _dead(self, entry_id: str, delivery: Delivery, reason: str) -> None:
        log.error("webhook_dead", webhook_id=delivery.event.webhook_id, reason=reason)
        record = json.loads(delivery.to_json())
        record["dead_reason"] = reason
        record["dead_at"] = time.time()
        self.store.dead(entry_id, delivery.event.webhook_id, json.dumps(record, ensure_ascii=False))


def job_body(tracker: JobTracker, event: WebhookEvent, memory_s: int) -> str | None:
    """The body its recorder kept for the event (`producer/webhooks/bodies.py`), else the JSON
    of `GET /v1/jobs/{id}` once the job is done, kept then for `memory_s` (unless its recorder
    kept one meanwhile: that one); None while it is not; EventSuperseded when it ended
    otherwise than the event says.

    EventUnsendable when the job is still in Redis but does not belong to the event's tenant (a
    job without a tenant belongs to nobody), or is gone and no body was kept for that tenant:
    no status leaves for that URL but its own tenant's."""
    if was_sent(tracker.connection, event):  # taken over from a dispatcher that booked it
        raise EventSuperseded(f"{event.event} was delivered already")
    kept = kept_body(tracker.connection, event)
    try:
        status = tracker.status(event.job_id)
    except JobNotFoundError as e:
        if kept is not None:
            return kept
        other = told_otherwise(tracker.connection, event)
        if other is not None:
            raise EventSuperseded(f"{event.event} for a job that ended as {other}") from e
        raise EventUnsendable("the job is no longer in Redis and no body was kept") from e
    if not event.tenant or status.tenant != event.tenant:
        raise EventUnsendable(
            f"the job does not belong to the event's tenant {event.tenant or '(none)'!r}"
        )
    if kept is not None:
        return kept
    if status.state not in TERMINAL_STATES:
        return None
    if not tells(status, event):
        raise EventSuperseded(f"{event.event} for a job that ended {status.state}")
    return settle(tracker.connection, event, event_body(status, event), memory_s)


def _receiver_of(fields: dict[str, str]) -> str:
    """The receiver of an outbox entry, its URL's origin `scheme://host:port` ("" when the
    entry cannot be read)."""
    try:
        parts = urlsplit(_placeholder(fields).event.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except (KeyError, ValueError):
        return ""
    return f"{parts.scheme}://{parts.hostname}:{port}"


def _placeholder(fields: dict[str, str]) -> Delivery:
    if "delivery" in fields:
        return Delivery.from_json(fields["delivery"])
    frozen = fields.get("body", "")  # a document's event comes with its body
    return Delivery(WebhookEvent.from_fields(fields), frozen, 0, time.time())
