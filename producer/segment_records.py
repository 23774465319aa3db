"""`cosyq document backfill-records`: the segments' record of every live plan lacking one.

`save_plan` (and a retry's `revive`) writes, beside a document's plan, the record that outlives
it (`SegmentsRecord`: its tenant and segment count) and notes when to look at the plan; once the
plan is gone, the workers' housekeeping (`workers.documents.expiry`) deletes the segments' audio
from that record. A document submitted by a producer from before records were written has none:
never retried, it keeps its segments' audio forever. This walks the plans in Redis once (SCAN,
never KEYS) and writes the record for each that lacks one, due at the plan's own expiry.

An operator's command rather than a housekeeping duty: the plans it can concern are a finite
set, written before an upgrade and all gone one COSYQ_RESULT_TTL_S after their last progress,
so one walk after every producer runs this version covers them; a duty would walk the whole
keyspace again on every fleet forever (or keep a cursor and a done flag) for nothing.

Nothing is overwritten: the record is set only where none is (HSETNX) and the look only where
none is noted (ZADD NX), so a retry or submit writing its own meanwhile wins. A document already
assembled (its result published) is skipped: its assembler, or the cleanup duty after a crash,
deletes its segments' audio.
"""

from __future__ import annotations

import time

import redis
from pydantic import ValidationError

from shared.document_state import (
    DOCUMENT_PREFIX,
    SEGMENT_RECORDS,
    SEGMENTS_DUE,
    DocumentPlanRecord,
    SegmentsRecord,
    document_key,
)
from shared.keys import JOB_ID_RE
from shared.logs import get_logger

log = get_logger(__name__)
SCAN_COUNT = 500  # keys per SCAN step: the walk never blocks Redis for long
NO_TTL, GONE = -1, -2  # PTTL of a key that never expires, of one that is gone


def backfill_segment_records(connection: redis.Redis, result_ttl_s: int) -> list[str]:
    """The ids of the documents whose plan had no segments' record and now has one."""
    written = []
    for raw in connection.scan_iter(match=DOCUMENT_PREFIX + "*", count=SCAN_COUNT):
        document_id = raw.decode().removeprefix(DOCUMENT_PREFIX)
        if JOB_ID_RE.fullmatch(document_id) and _backfill(connection, document_id, result_ttl_s):
            written.append(document_id)
    return written


def _backfill(connection: redis.Redis, document_id: str, result_ttl_s: int) -> bool:
    """Write the document's record when its plan lives, has none and is not assembled."""
    if connection.hexists(SEGMENT_RECORDS, document_id):
        return False
    if connection.exists(document_key(document_id, "result")):
        return False  # assembled: the audio is its assembler's (or the cleanup duty's) to delete
    raw = connection.get(document_key(document_id))
    left_ms = int(connection.pttl(document_key(document_id)))
    if raw is None:
        return False  # gone meanwhile: nothing says how many segments it had
    try:
        plan = DocumentPlanRecord.model_validate_json(raw)
    except ValidationError as e:
        log.error("document_plan_unreadable", document_id=document_id, error=str(e))
        return False
    record = SegmentsRecord(tenant=plan.tenant, segments=len(plan.segments))
    left_s = {NO_TTL: result_ttl_s, GONE: 0.0}.get(left_ms, left_ms / 1000)
    with connection.pipeline() as pipe:  # MULTI: the record and its look together
        pipe.hsetnx(SEGMENT_RECORDS, document_id, record.model_dump_json())
        pipe.zadd(SEGMENTS_DUE, {document_id: time.time() + left_s}, nx=True)
        added, _ = pipe.execute()
    if added:
        log.info("document_segments_recorded", document_id=document_id, segments=record.segments)
    return bool(added)
