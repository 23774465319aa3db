"""`cosyq document backfill-records`, its second walk: the outputs' record of every assembled
document whose assembler wrote none (one from before this record existed).

The assembler writes, with the result, the record that deletes the document's file, manifest,
captions and kept segments once the result has expired (shared/document_outputs.py). A
document assembled by an older worker has none: its outputs would be kept for ever. This walks
the results in Redis once (SCAN, never KEYS) and writes the record for each that lacks one, due
at the result's own expiry, as COSYQ_AUDIO_RETENTION (the operator's) says: nothing under
`keep`. A document whose result had already expired before the walk is not found: its outputs
stay (README: Long-form documents).

Nothing is overwritten: the record is set only where none is (HSETNX), the look only where none
is noted (ZADD NX).
"""

from __future__ import annotations

import time

import redis
from pydantic import ValidationError

from producer.segment_records import GONE, NO_TTL, SCAN_COUNT
from shared.document_outputs import (
    OUTPUT_RECORDS,
    OUTPUTS_DUE,
    deletes_anything,
    outputs_of,
)
from shared.document_state import DOCUMENT_PREFIX, DocumentPlanRecord, document_key
from shared.keys import JOB_ID_RE
from shared.logs import get_logger
from shared.settings import Settings

log = get_logger(__name__)
RESULT_SUFFIX = ":result"


def backfill_output_records(connection: redis.Redis, settings: Settings) -> list[str]:
    """The ids of the assembled documents that had no outputs' record and now have one."""
    written = []
    match = DOCUMENT_PREFIX + "*" + RESULT_SUFFIX
    for raw in connection.scan_iter(match=match, count=SCAN_COUNT):
        document_id = raw.decode().removeprefix(DOCUMENT_PREFIX).removesuffix(RESULT_SUFFIX)
        if JOB_ID_RE.fullmatch(document_id) and _backfill(connection, settings, document_id):
            written.append(document_id)
    return written


def _backfill(connection: redis.Redis, settings: Settings, document_id: str) -> bool:
    """Write the document's record when it is assembled, its plan lives and it has none."""
    if connection.hexists(OUTPUT_RECORDS, document_id):
        return False
    raw = connection.get(document_key(document_id))
    left_ms = int(connection.pttl(document_key(document_id, "result")))
    if raw is None or left_ms == GONE:
        return False  # its plan gone: nothing says where its outputs are
    try:
        plan = DocumentPlanRecord.model_validate_json(raw)
    except ValidationError as e:
        log.error("document_plan_unreadable", document_id=document_id, error=str(e))
        return False
    record = outputs_of(plan, settings)
    if not deletes_anything(settings, document_id, record):
        return False
    left_s = settings.result_ttl_s if left_ms == NO_TTL else left_ms / 1000
    with connection.pipeline() as pipe:  # MULTI: the record and its look together
        pipe.hsetnx(OUTPUT_RECORDS, document_id, record.model_dump_json())
        pipe.zadd(OUTPUTS_DUE, {document_id: time.time() + left_s}, nx=True)
        added, _ = pipe.execute()
    if added:
        log.info("document_outputs_recorded", document_id=document_id)
    return bool(added)
