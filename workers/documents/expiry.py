"""Delete the segment audio of a document that will never be assembled, once no retry can use it.

A document that failed for good (a segment past its retries, its assembly), was canceled, or
whose workers all died keeps its done segments' audio while its plan lives: `retry` reuses
them. The plan lives COSYQ_RESULT_TTL_S from the document's last progress (the keepalive renews
it only while one of its jobs waits or runs, a retry renews it); once it is gone, nothing can
retry the document, and nothing but the record `save_plan` wrote beside the plan (its tenant,
how many segments) says where that audio is. So every worker's housekeeping runs this duty (one
holder per tick, under a short lock): a document whose record is due (its plan's expiry, as
last seen) has its plan looked at. A plan still there (a retry renewed it: the document may be
live again) puts the look off to its new expiry; a plan gone has its segments' audio deleted,
then the record. An assembler that deletes the audio itself drops the record.

The keys deleted are never read from Redis: they are derived from the record as the producer
made them (each segment's own key under its tenant's prefix, `check_document_keys` as the
assembler checks a plan's), after the document id and the tenant are checked as names and the
count against COSYQ_MAX_DOCUMENT_SEGMENTS. A record rewritten in Redis can therefore name only
the segment audio of a document whose plan is gone (which is garbage whoever's it is), never
another file; one that fails a check is dropped, nothing deleted, logged as an error.
COSYQ_DOCUMENT_KEEP_SEGMENTS keeps every document's segments: a due record is dropped.
"""

from __future__ import annotations

from shared.document_state import (
    SEGMENT_EXPIRY_LOCK,
    SegmentsRecord,
    document_key,
    due_segment_records,
    segments_due_in,
    segments_forgotten,
    segments_record,
)
from shared.documents import document_folder, segment_key
from shared.errors import InvalidRequestError
from shared.keys import JOB_ID_RE
from shared.logs import get_logger
from shared.output_keys import check_document_keys, tenant_prefix
from shared.tenants import DEFAULT_TENANT, check_tenant_name
from workers.documents.duty import StorageDuty

log = get_logger(__name__)
EXPIRY_BATCH = 20  # documents looked at per tick (the rest wait a tick)
NO_TTL = -1  # PTTL of a key that never expires
GONE = -2  # PTTL of a key that does not exist


def record_keys(document_id: str, record: SegmentsRecord, max_segments: int) -> list[str]:
    """The storage keys of the document's segments' audio, derived from its record; each one
    exactly its own under its tenant's prefix. InvalidRequestError when the record cannot be
    a document's (its id or tenant not a name, more segments than a document may have)."""
    if not JOB_ID_RE.fullmatch(document_id):
        raise InvalidRequestError(f"document {document_id!r}: not a document id")
    owner = DEFAULT_TENANT if record.tenant is None else check_tenant_name(record.tenant)
    if record.segments > max_segments:
        raise InvalidRequestError(
            f"document {document_id}: {record.segments:,} segments, limit {max_segments:,}"
        )
    prefix = tenant_prefix(owner)
    keys = [prefix + segment_key(document_id, i) for i in range(record.segments)]
    own_file = prefix + document_folder(document_id) + document_id  # nothing of it deleted
    check_document_keys(owner, document_id, own_file, enumerate(keys))
    return keys


class ExpiredSegments(StorageDuty):
    """A housekeeping duty: `tick()` once per heartbeat interval, one holder per tick."""

    lock_key = SEGMENT_EXPIRY_LOCK

    def tick(self) -> list[str]:
        """The documents whose segments' audio this tick deleted."""
        if not self.holds_this_tick():
            return []
        deleted = []
        for document_id in due_segment_records(self.connection, EXPIRY_BATCH):
            if self._look(document_id):
                deleted.append(document_id)
        return deleted

    def _look(self, document_id: str) -> bool:
        left_ms = int(self.connection.pttl(document_key(document_id)))
        if left_ms != GONE:  # still retriable: look again when it may have expired
            left_s = self.settings.result_ttl_s if left_ms == NO_TTL else left_ms / 1000
            segments_due_in(self.connection, document_id, left_s)
            return False
        record = segments_record(self.connection, document_id)
        if record is None or self.settings.document_keep_segments:
            segments_forgotten(self.connection, document_id)
            return False
        try:
            keys = record_keys(document_id, record, self.settings.max_document_segments)
        except InvalidRequestError as e:
            log.error("document_segments_refused", document_id=document_id, error=str(e))
            segments_forgotten(self.connection, document_id)
            return False
        for key in keys:
            self.storage.delete(key)
        folder = tenant_prefix(record.tenant or DEFAULT_TENANT) + document_folder(document_id)
        self.storage.remove_empty_folder(folder + "segments/")
        self.storage.remove_empty_folder(folder)  # its file named elsewhere, or never made
        segments_forgotten(self.connection, document_id)
        log.info("document_segments_expired", document_id=document_id, segments=len(keys))
        return True
