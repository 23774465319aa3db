"""Finish what a crash left between a document's published file and deleting its segments' audio.

The assembler publishes the result in a MULTI that also notes the document in
`SEGMENTS_PENDING`, deletes each segment's audio, then clears the note. An assembler killed in
between leaves segment audio that nothing would ever delete (the document is assembled: no
assembly runs again), so every worker's housekeeping runs this duty (one holder per tick, under
a short lock): a note COSYQ_DOCUMENT_ASSEMBLY_GRACE_S old whose document is assembled has its
segments' audio deleted, after the assembler's own check of the plan's keys (`check_plan_keys`:
each segment's key exactly its own under the plan's tenant prefix, so a plan rewritten in Redis
cannot name another tenant's file, nor another document's). A note whose plan is gone or
unreadable, whose document has no result (expired), or whose plan fails that check is dropped,
nothing deleted (the last logged as an error: someone rewrote the plan); the segments' record
(`workers.documents.expiry`) still deletes them once the plan has expired.
"""

from __future__ import annotations

from pydantic import ValidationError

from shared.document_state import (
    SEGMENT_CLEANUP_LOCK,
    DocumentNotFoundError,
    load_plan,
    load_result,
    pending_segment_deletions,
    segments_deleted,
)
from shared.errors import InvalidRequestError
from shared.logs import get_logger
from workers.documents.duty import StorageDuty
from workers.documents.job import check_plan_keys, delete_segments

log = get_logger(__name__)
CLEANUP_BATCH = 20  # documents looked at per tick (a crash leaves one; the rest wait a tick)


class SegmentCleanup(StorageDuty):
    """A housekeeping duty: `tick()` once per heartbeat interval, one holder per tick."""

    lock_key = SEGMENT_CLEANUP_LOCK

    def tick(self) -> list[str]:
        """The documents whose segments' audio this tick deleted."""
        if not self.holds_this_tick():
            return []
        grace = self.settings.document_assembly_grace_s
        cleaned = []
        for document_id in pending_segment_deletions(self.connection, grace, CLEANUP_BATCH):
            if self._clean(document_id):
                cleaned.append(document_id)
            else:
                segments_deleted(self.connection, document_id)  # nothing it may delete
        return cleaned

    def _clean(self, document_id: str) -> bool:
        try:
            plan = load_plan(self.connection, document_id)
            assembled = load_result(self.connection, document_id) is not None
        except (DocumentNotFoundError, ValidationError):
            return False
        if not assembled:
            return False
        try:
            if plan.document_id != document_id:
                raise InvalidRequestError(f"its plan is document {plan.document_id!r}'s")
            check_plan_keys(plan, None)
        except InvalidRequestError as e:
            log.error("document_segments_refused", document_id=document_id, error=str(e))
            return False
        delete_segments(self.connection, self.storage, plan)
        log.warning(
            "document_segments_deleted_late", document_id=document_id, segments=len(plan.segments)
        )
        return True
