"""Delete an assembled document's outputs once its result has expired, as COSYQ_AUDIO_RETENTION
says (shared/document_outputs.py: the record the assembler wrote with the result).

Every worker's housekeeping runs this duty (one holder per tick, under a short lock): a
document whose record is due has its keys looked at. Its result or plan still there puts the
look off to the later of their expiries; both gone, its outputs are deleted as the retention
says, then the record. The document's own folder (`documents/<id>/`: its file, manifest and
captions unless its request named an `output_key`, and the segments' audio kept by
COSYQ_DOCUMENT_KEEP_SEGMENTS) is its alone and goes by key, then the folder itself where it is
one (a folder storage). Files at a caller's `output_key` go only under `with_result`, and only
while the file there is still this document's (a note beside it, or the S3 object's
`document-id`): a later job or document that reused the key keeps its own; a file that cannot
say whose it is (written before notes were kept beside a document's files) stays.
"""

from __future__ import annotations

from shared.document_outputs import (
    OUTPUT_EXPIRY_LOCK,
    document_own_folder,
    due_outputs,
    output_keys,
    outputs_due_in,
    outputs_forgotten,
    outputs_record,
)
from shared.document_state import document_key
from shared.errors import InvalidRequestError, StorageUnavailableError
from shared.logs import get_logger
from workers.documents.duty import StorageDuty

log = get_logger(__name__)
EXPIRY_BATCH = 20  # documents looked at per tick (the rest wait a tick)
NO_TTL = -1  # PTTL of a key that never expires
GONE = -2  # PTTL of a key that does not exist


class ExpiredOutputs(StorageDuty):
    """A housekeeping duty: `tick()` once per heartbeat interval, one holder per tick."""

    lock_key = OUTPUT_EXPIRY_LOCK

    def tick(self) -> list[str]:
        """The documents whose outputs this tick deleted."""
        if not self.holds_this_tick():
            return []
        deleted = []
        for document_id in due_outputs(self.connection, EXPIRY_BATCH):
            try:
                if self._look(document_id):
                    deleted.append(document_id)
            except StorageUnavailableError as e:  # passing: the next tick tries again
                log.warning("document_outputs_expiry_failed", document_id=document_id, error=str(e))
                break
        return deleted

    def _left_s(self, document_id: str) -> float | None:
        """Seconds until the document's result and plan are both gone; None: gone now."""
        left = [
            int(self.connection.pttl(document_key(document_id, part))) for part in ("result", "")
        ]
        if all(ms == GONE for ms in left):
            return None
        return max(self.settings.result_ttl_s if ms == NO_TTL else ms / 1000 for ms in left)

    def _look(self, document_id: str) -> bool:
        left_s = self._left_s(document_id)
        if left_s is not None:  # still there: look again when it may have expired
            outputs_due_in(self.connection, document_id, left_s)
            return False
        record = outputs_record(self.connection, document_id)
        if record is None or self.settings.audio_retention == "keep":
            outputs_forgotten(self.connection, document_id)
            return False
        try:
            found = output_keys(document_id, record, self.settings.max_document_segments)
        except InvalidRequestError as e:
            log.error("document_outputs_refused", document_id=document_id, error=str(e))
            outputs_forgotten(self.connection, document_id)
            return False
        for key in found.own:
            self.storage.delete(key)
        folder = document_own_folder(document_id, record.tenant)
        self.storage.remove_empty_folder(folder + "segments/")
        self.storage.remove_empty_folder(folder)
        named = []
        if self.settings.audio_retention == "with_result":
            named = [k for k in found.named if self.storage.document_of(k) == document_id]
        for key in named:
            self.storage.delete(key)
        outputs_forgotten(self.connection, document_id)
        deleted = len(found.own) + len(named)
        log.info("document_outputs_expired", document_id=document_id, files=deleted)
        return deleted > 0
