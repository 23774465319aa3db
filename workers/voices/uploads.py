"""Delete voice recordings that nothing names and nothing will: a housekeeping duty.

The producer notes each recording before writing it (shared/voice_uploads.py); every worker's
housekeeping runs this duty (one holder per tick, under a short lock) on the notes whose time
has come: a recording whose add-voice job still waits or runs is looked at again one
COSYQ_VOICE_UPLOAD_GRACE_S later, one its voice names is kept, any other is deleted
(`voice_upload_deleted`: a front killed mid upload, a job failed for good). Only what the note
can be checked to be is deleted: its owner and name are checked as names, and the key is one of
that owner's uploads for that voice in this worker's storage, its file a random upload name
(`upload_key`, as `add_voice` finds the recording it may delete); a note that fails a check is
dropped, nothing deleted, logged as an error.
"""

from __future__ import annotations

import time

from shared import keys
from shared.errors import InvalidRequestError
from shared.logs import get_logger
from shared.voice_uploads import (
    UPLOAD_FILE_RE,
    Verdict,
    VoiceUpload,
    due_uploads,
    judge,
)
from shared.voices import check_owner, check_voice_name, upload_key
from workers.documents.duty import StorageDuty

log = get_logger(__name__)
SWEEP_BATCH = 20  # notes looked at per tick (a crash leaves one; the rest wait a tick)


class VoiceUploadSweep(StorageDuty):
    """`tick()` once per heartbeat interval, one holder per tick; `sweep(now)` does the work."""

    lock_key = keys.VOICE_UPLOAD_SWEEP_LOCK

    def tick(self) -> list[str]:
        if not self.holds_this_tick():
            return []
        return self.sweep(time.time())

    def sweep(self, now: float) -> list[str]:
        """The URIs of the recordings deleted, of the notes due at `now`."""
        deleted = []
        for raw in due_uploads(self.connection, now, SWEEP_BATCH):
            later = self._settle(raw, now)
            if later is not None:
                deleted.append(later)
        return deleted

    def _settle(self, raw: bytes, now: float) -> str | None:
        """One due note: put off, kept or deleted; the URI when its recording was deleted."""
        try:
            upload = VoiceUpload.from_member(raw)
            key = self._own_key(upload)
        except (ValueError, InvalidRequestError) as e:
            log.error("voice_upload_note_refused", error=str(e))
            self.connection.zrem(keys.VOICE_UPLOADS, raw)
            return None
        verdict = judge(self.connection, upload)
        if verdict is Verdict.PENDING:
            later = now + self.settings.voice_upload_grace_s
            self.connection.zadd(keys.VOICE_UPLOADS, {raw: later}, xx=True)
            return None
        if verdict is Verdict.ORPHANED and key is not None:
            self.storage.delete(key)
            log.warning("voice_upload_deleted", owner=upload.owner, voice=upload.name, key=key)
        self.connection.zrem(keys.VOICE_UPLOADS, raw)
        return upload.uri if verdict is Verdict.ORPHANED and key is not None else None

    def _own_key(self, upload: VoiceUpload) -> str | None:
        """The recording's key in this worker's storage; None for one stored elsewhere (another
        COSYQ_STORAGE_URL: left alone). InvalidRequestError for a note that is no upload."""
        check_owner(upload.owner)
        check_voice_name(upload.name)
        key = upload_key(self.storage.uri_for, upload.owner, upload.name, upload.uri)
        if key is not None and not UPLOAD_FILE_RE.fullmatch(key.rsplit("/", 1)[-1]):
            raise InvalidRequestError(f"voice upload {upload.uri!r}: not an upload's name")
        return key
