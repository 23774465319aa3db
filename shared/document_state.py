"""A document's state in Redis: JSON only, each key with the results' TTL (from its last
recorded segment or retry, so a document still running is never forgotten).

    cosyq:document:<id>            the plan (DocumentPlanRecord): options, seed, every segment;
                                   its tenant first (`plan_owner` reads only that)
    cosyq:document:<id>:jobs       hash: segment index -> its current job id (retry replaces)
    cosyq:document:<id>:done       hash: segment index -> SegmentDone (written by the worker)
    cosyq:document:<id>:assembly   the current assembly job's id, once enqueued (each assembly
                                   has its own: new_assembly_job_id)
    cosyq:document:<id>:claim      the assembler's token while it writes (heartbeat: PEXPIRE)
    cosyq:document:<id>:result     DocumentResult, once assembled
    cosyq:document:<id>:event      set when its webhook event was appended (a retry clears it)
    cosyq:document:<id>:event-seq  how many events it has had (the next webhook id's suffix)
    cosyq:document-idem:[<tenant>:]<sha256>   idempotency key -> document id (keys.tenant_digest)
    cosyq:document-assembly-pending   sorted set: document id -> when its assembly marker was
                                      set; removed once the assembly job is enqueued
    cosyq:document-live   sorted set: document id -> when its keys' TTL was last renewed for
                          a job of it still waiting or running (submit and retry add it)
    cosyq:document-segments-pending   sorted set: document id -> when its file was published
                                      with its segments' audio still to delete; removed once
                                      deleted (`workers.documents.cleanup` finishes a crash's)
    cosyq:document-segment-records   hash: document id -> SegmentsRecord (its tenant, how many
                                     segments), written with the plan, no TTL: what deleting
                                     its segments' audio needs once the plan is gone
    cosyq:document-segments-due   sorted set: document id -> when its plan expires (as last
                                  seen); `workers.documents.expiry` looks then, and deletes the
                                  audio of a document whose plan is gone (no retry can reuse it)

The producer writes the plan and jobs once, the worker that finishes a segment records it and,
when it was the last one, enqueues the assembly (`record_segment`: one Lua script, so two
workers finishing the last two segments at once enqueue it once). The same script notes the
document as pending assembly, and the enqueue clears the note; a worker killed between the two
leaves the note, and any worker's housekeeping (`workers.documents.sweep`) enqueues the job the
marker names once the note is COSYQ_DOCUMENT_ASSEMBLY_GRACE_S old. Nothing depends on the
producer staying alive.

A document never expires while one of its jobs waits or runs: a segment job renews the TTL
when it starts (`start_segment`) and when it is recorded, and every worker's housekeeping
(`workers.documents.keepalive`) renews it for a document noted live whose jobs still wait in a
queue however deep. A segment job that starts after its document expired all the same (no
worker anywhere for longer than the TTL) fails as an invalid request naming the document.

A document never assembled (failed for good, canceled, expired) keeps its segments' audio while
its plan lives, for `retry`; `save_plan` also writes a record that outlives the plan (tenant,
segment count) and notes when the plan expires, and once it has, any worker's housekeeping
(`workers.documents.expiry`) deletes that audio. A plan from before records gets its record
from a retry or from `cosyq document backfill-records` (`producer.segment_records`).
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import redis
from pydantic import BaseModel, ConfigDict, Field, JsonValue
from rq import Queue, Retry
from rq.serializers import JSONSerializer

from shared import keys
from shared.errors import CosyqError, InvalidRequestError
from shared.jobs import retry_intervals
from shared.keys import PREFIX, queue_for
from shared.results import PieceTiming, Verdict
from shared.settings import Settings
from shared.submitted import record_submitted
from shared.tenants import DEFAULT_TENANT, TENANT_META_KEY, queue_name

DOCUMENT_PREFIX = PREFIX + "document:"
DOCUMENT_IDEMPOTENCY_PREFIX = PREFIX + "document-idem:"
ASSEMBLY_PENDING = PREFIX + "document-assembly-pending"  # see the module docstring
ASSEMBLY_SWEEP_LOCK = PREFIX + "document-assembly-sweep-lock"  # one sweeper per tick
LIVE_DOCUMENTS = PREFIX + "document-live"  # see the module docstring
KEEPALIVE_LOCK = PREFIX + "document-keepalive-lock"  # one keeper per tick
SEGMENTS_PENDING = PREFIX + "document-segments-pending"  # see the module docstring
SEGMENT_CLEANUP_LOCK = PREFIX + "document-segment-cleanup-lock"  # one cleaner per tick
SEGMENT_RECORDS = PREFIX + "document-segment-records"  # see the module docstring
SEGMENTS_DUE = PREFIX + "document-segments-due"  # see the module docstring
SEGMENT_EXPIRY_LOCK = PREFIX + "document-segment-expiry-lock"  # one expirer per tick
DOCUMENT_META_KEY = "cosyq_document"  # job.meta of a segment's job: {"id": ..., "index": ...}
ASSEMBLE_DOCUMENT_FUNCTION = "workers.documents.assemble_document"
PLAN_HEAD_BYTES = 96  # {"schema_version":1,"tenant":"<1-32 characters>", with room to spare
_PLAN_HEAD_RE = re.compile(rb'\{"schema_version":1,"tenant":(null|"[a-z0-9][a-z0-9_-]{0,31}"),')


class DocumentNotFoundError(CosyqError):
    """No document with this id (never submitted, or expired after its TTL)."""


class DocumentFailedError(CosyqError):
    """A document cannot be assembled: a segment failed for good, or its job or audio is gone.
    The message names the segment, its first words and the reason."""

    def __init__(self, document_id: str, message: str) -> None:
        super().__init__(message)
        self.document_id = document_id


def document_key(document_id: str, part: str = "") -> str:
    return DOCUMENT_PREFIX + document_id + (f":{part}" if part else "")


def new_assembly_job_id(document_id: str) -> str:
    """A fresh id for one assembly of the document. Never reused: after a retry, a failed
    assembly's job must not be mistaken for the next one (whose hash, under the same id, would
    read `failed` until its enqueue rewrote it)."""
    return f"{document_id}-assembly-{uuid.uuid4().hex[:12]}"


def event_guard_key(document_id: str) -> str:
    """Set when the document's webhook event is appended (once per outcome, until a retry)."""
    return document_key(document_id, "event")


def idempotency_key(key: str, tenant: str) -> str:
    """The Redis key holding one tenant's document idempotency key (keys.tenant_digest)."""
    return DOCUMENT_IDEMPOTENCY_PREFIX + keys.tenant_digest(key, tenant)


class SegmentPlan(BaseModel):
    """One segment as submitted: what its job says, and where it sits."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    index: int = Field(ge=0)
    text: str  # the job's text (markup included)
    plain: str  # the words alone (manifest, captions, failure messages)
    pause_before_s: float = Field(ge=0)
    seed: int
    key: str  # storage key of its audio


class DocumentPlanRecord(BaseModel):
    """What the producer decided at submit; never changes afterwards."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_version: Literal[1] = 1
    # Who submitted it; None (a plan from before tenants): nobody's. Second, so the stored
    # JSON's first bytes name it (`plan_owner`).
    tenant: str | None = None
    document_id: str
    created_at: str
    seed: int
    job: dict[str, JsonValue]  # a segment's request without text and seed (the same for all)
    format: str
    sample_format: str
    sample_rate: int
    output_key: str  # the assembled file's key without extension
    priority: str
    idempotency_key: str | None = None
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    segments: list[SegmentPlan]


class SegmentsRecord(BaseModel):
    """What deleting a document's segment audio needs once its plan is gone: whose it is and
    how many segments it has. Their keys are never stored: `workers.documents.expiry` derives
    them as the producer did, so a record rewritten in Redis names no other file."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    tenant: str | None = None  # the plan's (None: a plan from before tenants, the root's)
    segments: int = Field(ge=1)


class SegmentDone(BaseModel):
    """What the worker records when a segment's job has stored its audio."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    job_id: str
    uri: str
    duration_s: float = Field(ge=0)
    attempt: int = 1
    pieces: list[PieceTiming] = Field(default_factory=list)
    verdict: Verdict | None = None  # its job's quality verdict (None: not checked)
    reasons: list[str] = Field(default_factory=list)  # why suspect


def document_verdict(done: Mapping[int, SegmentDone]) -> tuple[Verdict | None, list[int]]:
    """(verdict, suspect segment indices) of the segments done: suspect when any is, ok when
    every checked one is ok, None when none was checked."""
    suspect = sorted(index for index, d in done.items() if d.verdict == "suspect")
    if suspect:
        return "suspect", suspect
    return ("ok" if any(d.verdict == "ok" for d in done.values()) else None), []


class DocumentResult(BaseModel):
    """The assembled document: where its file, manifest and captions are."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_version: Literal[1] = 1
    document_id: str
    uri: str
    manifest_uri: str
    srt_uri: str
    vtt_uri: str
    bytes: int = Field(ge=0)
    sha256: str
    format: str
    sample_rate: int
    duration_s: float = Field(ge=0)
    segments: int = Field(ge=1)
    assembled_at: str
    assembler: str  # the worker that wrote it
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    verdict: Verdict | None = None  # suspect when any segment's quality verdict is
    suspect_segments: list[int] = Field(default_factory=list)  # their indices


# KEYS: jobs, done, assembly, pending, plan; ARGV: index, job id, SegmentDone JSON, ttl,
# assembly job id, document id. Returns -1 (not this document's current job for the index), 0
# (recorded), 1 (recorded and the last one: the caller enqueues the assembly job with the given
# id, then calls `assembly_enqueued`; until then the document is noted pending for the sweep).
# The plan, jobs and done keys live `ttl` from the last segment recorded: a document that runs
# longer than the TTL in all is never forgotten mid-way.
_RECORD_SEGMENT = """
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return -1 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
for _, key in ipairs({KEYS[1], KEYS[2], KEYS[5]}) do
  redis.call('EXPIRE', key, tonumber(ARGV[4]))
end
if redis.call('HLEN', KEYS[2]) < redis.call('HLEN', KEYS[1]) then return 0 end
if redis.call('SET', KEYS[3], ARGV[5], 'NX', 'EX', tonumber(ARGV[4])) then
  redis.call('ZADD', KEYS[4], redis.call('TIME')[1], ARGV[6])
  return 1
end
return 0
"""


# KEYS: plan, jobs, done; ARGV: index, job id, ttl. -1: the document expired; 0: the job is
# not the one its segment counts on (a retry replaced it); 1: it is, and the keys live `ttl`.
_START_SEGMENT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
for _, key in ipairs(KEYS) do redis.call('EXPIRE', key, tonumber(ARGV[3])) end
return 1
"""


def save_plan(pipe: Any, plan: DocumentPlanRecord, job_ids: list[str], ttl_s: int) -> None:
    """Queue the plan and its jobs hash on a pipeline (written with the segments' jobs)."""
    pipe.set(document_key(plan.document_id), plan.model_dump_json(), ex=ttl_s)
    jobs = document_key(plan.document_id, "jobs")
    pipe.hset(jobs, mapping={str(i): job_id for i, job_id in enumerate(job_ids)})
    pipe.expire(jobs, ttl_s)
    note_live(pipe, plan.document_id)
    note_segments(pipe, plan, ttl_s)


def note_segments(target: Any, plan: DocumentPlanRecord, ttl_s: int) -> None:
    """Record what deleting the document's segments' audio needs once its plan is gone, and
    look at the plan when it expires in `ttl_s` (`workers.documents.expiry`)."""
    record = SegmentsRecord(tenant=plan.tenant, segments=len(plan.segments))
    target.hset(SEGMENT_RECORDS, plan.document_id, record.model_dump_json())
    target.zadd(SEGMENTS_DUE, {plan.document_id: time.time() + ttl_s})


def note_live(target: Any, document_id: str) -> None:
    """Note the document as having jobs waiting (the keepalive renews its TTL while it has)."""
    target.zadd(LIVE_DOCUMENTS, {document_id: time.time()})


def renew(target: Any, document_id: str, ttl_s: int) -> None:
    """The plan, jobs, done and assembly marker keys live `ttl_s` from now (a missing one
    stays missing)."""
    for part in ("", "jobs", "done", "assembly"):
        target.expire(document_key(document_id, part), ttl_s)


def revive(pipe: Any, plan: DocumentPlanRecord, ttl_s: int) -> None:
    """A retry: the document's keys live `ttl_s` from now and for as long as its new jobs
    wait (`note_live`), and its segments' record looks at the plan's new expiry (a document
    submitted before records were written gets one)."""
    renew(pipe, plan.document_id, ttl_s)
    note_live(pipe, plan.document_id)
    note_segments(pipe, plan, ttl_s)


def start_segment(
    connection: redis.Redis, document_id: str, index: int, job_id: str, *, ttl_s: int
) -> None:
    """A segment's job starts: renew its document's TTL. Raises InvalidRequestError when the
    document expired before the job ran (nothing would ever assemble its audio)."""
    keys = [document_key(document_id, part) for part in ("", "jobs", "done")]
    eval_ = connection.eval
    outcome = int(eval_(_START_SEGMENT, 3, *keys, index, job_id, ttl_s))
    if outcome == -1:
        raise InvalidRequestError(
            f"document {document_id}: expired (no progress for COSYQ_RESULT_TTL_S) before "
            f"segment {index} ran; submit the document again"
        )


def not_found(document_id: str) -> DocumentNotFoundError:
    """The one answer for an unknown document (and, over HTTP, another tenant's)."""
    return DocumentNotFoundError(
        f"document {document_id}: not found (never submitted, or expired after its TTL)"
    )


@dataclass(frozen=True)
class PlanOwner:
    """Whose a document is, as its plan's first bytes say; `known` False for a plan whose head
    does not name it (written before the tenant led the plan): read the plan for it."""

    known: bool
    tenant: str | None = None


def plan_owner(connection: redis.Redis, document_id: str) -> PlanOwner:
    """The tenant from the first PLAN_HEAD_BYTES of the plan (DocumentNotFoundError when there
    is none): another tenant's document is refused without the plan being read, up to megabytes
    for a long document, so refusing it takes the time refusing an id never made takes."""
    head: Any = connection.getrange(document_key(document_id), 0, PLAN_HEAD_BYTES - 1)
    if not head:  # a plan is never empty
        raise not_found(document_id)
    found = _PLAN_HEAD_RE.match(head)
    if found is None:
        return PlanOwner(known=False)
    tenant = found.group(1)
    return PlanOwner(known=True, tenant=None if tenant == b"null" else tenant[1:-1].decode())


def load_plan(connection: redis.Redis, document_id: str) -> DocumentPlanRecord:
    raw = connection.get(document_key(document_id))
    if raw is None:
        raise not_found(document_id)
    return DocumentPlanRecord.model_validate_json(raw)


def job_ids(connection: redis.Redis, document_id: str) -> dict[int, str]:
    raw = connection.hgetall(document_key(document_id, "jobs"))
    return {int(_text(k)): _text(v) for k, v in raw.items()}


def done_segments(connection: redis.Redis, document_id: str) -> dict[int, SegmentDone]:
    raw = connection.hgetall(document_key(document_id, "done"))
    return {int(_text(k)): SegmentDone.model_validate_json(v) for k, v in raw.items()}


def load_result(connection: redis.Redis, document_id: str) -> DocumentResult | None:
    raw = connection.get(document_key(document_id, "result"))
    return None if raw is None else DocumentResult.model_validate_json(raw)


def record_segment(
    connection: redis.Redis,
    document_id: str,
    index: int,
    done: SegmentDone,
    *,
    ttl_s: int,
    assembly_job_id: str,
) -> int:
    """Record a finished segment; 1 when the caller must enqueue the assembly job."""
    keys = [document_key(document_id, part) for part in ("jobs", "done", "assembly")]
    keys += [ASSEMBLY_PENDING, document_key(document_id)]
    args = [index, done.job_id, done.model_dump_json(), ttl_s, assembly_job_id, document_id]
    eval_ = connection.eval
    return int(eval_(_RECORD_SEGMENT, 5, *keys, *args))  # type: ignore[arg-type]


def assembly_enqueued(connection: redis.Redis, document_id: str) -> None:
    """The assembly job the marker names is enqueued: the sweep has nothing left to do."""
    connection.zrem(ASSEMBLY_PENDING, document_id)


def pending_assemblies(connection: redis.Redis, older_than_s: float, count: int) -> list[str]:
    """Documents whose marker was set `older_than_s` ago or more, still noted pending."""
    now = float(connection.time()[0])
    found = connection.zrangebyscore(ASSEMBLY_PENDING, "-inf", now - older_than_s, 0, count)
    return [_text(d) for d in found if isinstance(d, bytes | str)]


def note_segments_pending(target: Any, document_id: str) -> None:
    """Note the document's segment audio as to be deleted (queued with its published result,
    so a crash before the deletion leaves the note for `workers.documents.cleanup`)."""
    target.zadd(SEGMENTS_PENDING, {document_id: time.time()})


def segments_deleted(connection: redis.Redis, document_id: str) -> None:
    """The document's segment audio is deleted (or never will be): nothing left to do."""
    connection.zrem(SEGMENTS_PENDING, document_id)


def segments_forgotten(connection: redis.Redis, document_id: str) -> None:
    """The document's segment audio is deleted, or is left to whoever keeps it: its record
    goes, and with it `workers.documents.expiry`'s look at its plan's end."""
    with connection.pipeline() as pipe:
        pipe.hdel(SEGMENT_RECORDS, document_id)
        pipe.zrem(SEGMENTS_DUE, document_id)
        pipe.execute()


def segments_record(connection: redis.Redis, document_id: str) -> SegmentsRecord | None:
    """The document's record (None: none, or one that does not read as a record)."""
    raw = connection.hget(SEGMENT_RECORDS, document_id)
    if raw is None:
        return None
    try:
        return SegmentsRecord.model_validate_json(raw)
    except ValueError:
        return None


def due_segment_records(connection: redis.Redis, count: int) -> list[str]:
    """Documents whose plan's expiry, as last seen, has come."""
    found = connection.zrangebyscore(SEGMENTS_DUE, "-inf", time.time(), 0, count)
    return [_text(d) for d in found if isinstance(d, bytes | str)]


def segments_due_in(connection: redis.Redis, document_id: str, seconds: float) -> None:
    """Look at the document's plan again in `seconds` (its TTL now: a retry renewed it)."""
    connection.zadd(SEGMENTS_DUE, {document_id: time.time() + seconds}, xx=True)


def pending_segment_deletions(
    connection: redis.Redis, older_than_s: float, count: int
) -> list[str]:
    """Documents noted `older_than_s` ago or more whose segment audio may still exist."""
    found = connection.zrangebyscore(SEGMENTS_PENDING, "-inf", time.time() - older_than_s, 0, count)
    return [_text(d) for d in found if isinstance(d, bytes | str)]


def assembly_job_id(connection: redis.Redis, document_id: str) -> str | None:
    """The id the document's assembly marker names (None: no marker)."""
    current = connection.get(document_key(document_id, "assembly"))
    return None if current is None else _text(current)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def enqueue_assembly(
    connection: redis.Redis,
    settings: Settings,
    document_id: str,
    job_id: str,
    priority: str,
    *,
    tenant: str | None,
) -> None:
    """The assembly job: an ordinary RQ job (JSON), retried like a segment on a lost worker,
    in the document's tenant's queue and tagged with it (a plan without a tenant, from before
    tenants: the default queue, untagged)."""
    retry = None
    if settings.max_retries > 0:
        intervals = retry_intervals(settings.max_retries, settings.retry_backoff_s)
        retry = Retry(max=settings.max_retries, interval=intervals)
    name = queue_name(queue_for(priority), tenant or DEFAULT_TENANT)
    queue = Queue(name, connection=connection, serializer=JSONSerializer)
    meta = {} if tenant is None else {TENANT_META_KEY: tenant}
    record_submitted(connection, [job_id])
    queue.enqueue_call(
        ASSEMBLE_DOCUMENT_FUNCTION,
        kwargs={"document_id": document_id},
        job_id=job_id,
        timeout=settings.job_timeout_s,
        result_ttl=settings.result_ttl_s,
        failure_ttl=settings.failure_ttl_s,
        description=f"assemble document {document_id}",
        meta=meta,
        retry=retry,
    )
