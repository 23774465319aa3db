"""A document's webhook events: `document.finished`, `document.failed`, `document.canceled`.

A document's webhook (the `webhook` of its request, kept in the plan's job template) hears
about the document, never about its segments: a segment's job or the assembly job ending sends
no `job.*` event (`document_job_ended`, called where any job's event would be appended). The
document's event carries its body, frozen when it is made (the document's status: state, the
DocumentResult with the file's, manifest's and captions' URIs, the segment verdicts, and
`occurred_at`, when the event was made, by which a receiver orders a document's events), so the
dispatcher sends it as it is.

Who tells: the assembler (`document.finished`, in the MULTI that publishes the result), the
worker that fails or cancels a segment or the assembly for good, and the producer's
`cancel_document` when it canceled queued segments (no worker ever sees those). Once per
outcome: one Lua script sets the document's event guard (NX) and appends the entry, so a
document whose segments are canceled together sends one event. `retry_document` clears the
guard: the retried document's own end is a new event, with a new webhook id
(`msg_<document id>_<outcome>_<n>`).
"""

from __future__ import annotations

import json
from typing import Any

from rq.job import Job
from rq.utils import now, utcformat

from shared import keys
from shared.document_state import (
    ASSEMBLE_DOCUMENT_FUNCTION,
    DOCUMENT_META_KEY,
    DocumentNotFoundError,
    DocumentPlanRecord,
    DocumentResult,
    SegmentDone,
    document_key,
    event_guard_key,
    load_plan,
)
from shared.logs import get_logger
from shared.webhooks import DocumentOutcome, EventName, check_webhook_url

log = get_logger(__name__)
GUARD_TTL_S = 7 * 86400  # when the plan's own TTL cannot be read (the plan expired)

# KEYS: guard, sequence, outbox, plan; ARGV: webhook id prefix, then the entry's field/value
# pairs. 1 when appended; 0 when this document's outcome was already told.
_APPEND_ONCE = """
local ttl = redis.call('TTL', KEYS[4])
if ttl <= 0 then ttl = tonumber(ARGV[1]) end
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ttl) then return 0 end
local n = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ttl)
local fields = {'webhook_id', ARGV[2] .. n}
for i = 3, #ARGV do fields[#fields + 1] = ARGV[i] end
redis.call('XADD', KEYS[3], '*', unpack(fields))
return 1
"""
OUTCOMES: dict[EventName, DocumentOutcome] = {
    "job.failed": "document.failed",
    "job.canceled": "document.canceled",
}


def document_webhook(
    plan: DocumentPlanRecord, allowed: tuple[str, ...], allow_private: bool
) -> str | None:
    """The document's webhook URL when this worker's allow-list takes it."""
    target = plan.job.get("webhook")
    url = target.get("url") if isinstance(target, dict) else None
    if not isinstance(url, str):
        return None
    try:
        return check_webhook_url(url, allowed, allow_private=allow_private)
    except ValueError as e:
        log.warning("webhook_refused", document_id=plan.document_id, reason=str(e))
        return None


def append_document_event(
    connection: Any,
    plan: DocumentPlanRecord,
    outcome: DocumentOutcome,
    url: str,
    body: dict[str, Any],
) -> None:
    """Run the once-per-outcome script (on a client or a MULTI pipeline); the body gets
    `occurred_at`, when the event was made (ISO 8601 UTC)."""
    document_id, moment = plan.document_id, now()
    fields = {"event": outcome, "job_id": document_id, "url": url, "at": utcformat(moment)}
    fields["tenant"] = plan.tenant or ""  # whose document (none: nobody's, never sent)
    body = {**body, "occurred_at": moment.isoformat()}  # as a job's: receivers order by it
    fields["body"] = json.dumps(body, ensure_ascii=False, sort_keys=True)
    prefix = f"msg_{document_id}_{outcome.split('.')[1]}_"
    key_names = [event_guard_key(document_id), document_key(document_id, "event-seq")]
    key_names += [keys.WEBHOOK_OUTBOX, document_key(document_id)]
    pairs = [item for pair in fields.items() for item in pair]
    connection.eval(_APPEND_ONCE, 4, *key_names, GUARD_TTL_S, prefix, *pairs)


def document_finished(
    pipe: Any,
    plan: DocumentPlanRecord,
    result: DocumentResult,
    allowed: tuple[str, ...],
    allow_private: bool,
) -> None:
    """Queue `document.finished` beside the result on the assembler's MULTI pipeline."""
    url = document_webhook(plan, allowed, allow_private)
    if url is None:
        return
    body: dict[str, Any] = {"document_id": plan.document_id, "event": "document.finished"}
    body.update(state="assembled", result=result.model_dump(mode="json"), message="")
    append_document_event(pipe, plan, "document.finished", url, body)


def document_job_ended(
    connection: Any, job: Job, event: EventName, allowed: tuple[str, ...], allow_private: bool
) -> bool:
    """True when `job` is a document's segment or assembly: its end is the document's to tell
    (failed or canceled: the document's event, once, if the job is still the one its segment
    or the assembly counts on; finished: nothing, the assembler tells).
    `connection` may be a MULTI pipeline (the reaper's): the plan is read through the job's
    own connection."""
    place = document_place(job)
    if place is None:
        return False
    document_id, segment = place
    outcome = OUTCOMES.get(event)
    if outcome is not None and _is_current(job, document_id, segment):
        document_ended(
            connection,
            document_id,
            outcome,
            (allowed, allow_private),
            cause=(segment, job.id),
            reads=job.connection,
        )
    return True


def document_place(job: Job) -> tuple[str, Any] | None:
    """The document and segment index (None: the assembly) of a document's job; None for any
    other job."""
    meta = job.meta.get(DOCUMENT_META_KEY) if isinstance(job.meta, dict) else None
    if isinstance(meta, dict) and isinstance(meta.get("id"), str):
        return meta["id"], meta.get("index")
    if job.func_name == ASSEMBLE_DOCUMENT_FUNCTION:
        return str((job.kwargs or {}).get("document_id")), None
    return None


def _is_current(job: Job, document_id: str, segment: Any) -> bool:
    """Whether `job` is still the one its segment (or the assembly) counts on, its segment not
    done. A job a retry replaced (two retries at once), or one whose audio was recorded before
    its worker died and the reaper failed it, ends as nobody's news: told, its event would be
    false and its guard would silence the document's real end."""
    if isinstance(segment, int):
        current = job.connection.hget(document_key(document_id, "jobs"), str(segment))
        done = job.connection.hget(document_key(document_id, "done"), str(segment))
        if done is not None and SegmentDone.model_validate_json(done).job_id == job.id:
            current = None  # done: the document goes on to its assembly
    else:
        current = job.connection.get(document_key(document_id, "assembly"))
    current = current.decode() if isinstance(current, bytes) else current
    if current == job.id:
        return True
    log.info("document_job_superseded", document_id=document_id, job_id=job.id, current=current)
    return False


def document_ended(
    connection: Any,
    document_id: str,
    outcome: DocumentOutcome,
    webhooks: tuple[tuple[str, ...], bool],
    *,
    cause: tuple[int | None, str],
    reads: Any = None,
) -> None:
    """Tell the document's webhook (once) that it failed or was canceled; `webhooks` is the
    allow-list and whether private receivers are allowed, `cause` the segment index (None: the
    assembly) and the job id that ended it, `reads` a client to read the plan through when
    `connection` is a pipeline."""
    try:
        plan = load_plan(reads if reads is not None else connection, document_id)
    except DocumentNotFoundError:
        return
    url = document_webhook(plan, *webhooks)
    if url is None:
        return
    state = outcome.split(".")[1]
    body: dict[str, Any] = {"document_id": document_id, "event": outcome, "state": state}
    body.update(segment=cause[0], job_id=cause[1], result=None)
    body["message"] = _message(body)
    append_document_event(connection, plan, outcome, url, body)
    log.info("webhook_event_recorded", document_id=document_id, webhook_event=outcome)


def _message(body: dict[str, Any]) -> str:
    where = "the assembly" if body["segment"] is None else f"segment {body['segment']}"
    return (
        f"document {body['document_id']}: {where} {body['state']} (job {body['job_id']}); "
        f"GET /v1/documents/{body['document_id']} has the details"
    )
