"""Voice recordings in flight: noted in Redis before they are written, so none is ever lost.

`cosyq voices add` and `POST /v1/audio/voices` write the recording to storage, then enqueue the
add-voice job that registers it. A front killed between the two (or an add-voice job that
failed for good) left the recording in storage with nothing that names it. So before the
recording is written, `note_upload` adds it to `keys.VOICE_UPLOADS` (owner, name, its URI and
the id its job will have), scored COSYQ_VOICE_UPLOAD_GRACE_S ahead; a worker's housekeeping
(workers/voices/uploads.py) looks at each one once that time has come (`judge`):
- its job still waits or runs: looked at again one grace later;
- its owner's voice of that name names the recording: it is kept, the note dropped;
- else (no job: the front died before enqueueing it; or the job ended without registering it,
  or the voice was replaced or removed since): the recording is deleted, the note dropped.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import cast

import redis
from rq.job import Job
from rq.utils import as_text

from shared import keys
from shared.connection import REDIS_OUTAGE
from shared.errors import InvalidRequestError, UnknownVoiceError
from shared.logs import get_logger
from shared.voices import VoiceRegistry

log = get_logger(__name__)

PENDING_STATES = frozenset({"queued", "started", "scheduled", "deferred"})
UPLOAD_FILE_RE = re.compile(r"[0-9a-f]{32}\.[a-z0-9]{1,8}")  # an upload's file: <random>.<suffix>


@dataclass(frozen=True)
class VoiceUpload:
    """One recording written for `owner`'s voice `name`, to be registered by job `job_id`."""

    owner: str
    name: str
    uri: str
    job_id: str

    def member(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_member(cls, raw: bytes | str) -> VoiceUpload:
        """ValueError for a member that is not one (a note written by hand)."""
        try:
            fields = json.loads(raw)
            return cls(**{name: str(fields[name]) for name in ("owner", "name", "uri", "job_id")})
        except (TypeError, KeyError, json.JSONDecodeError) as e:
            raise ValueError(f"not a voice upload note: {e}") from e


class Verdict(StrEnum):
    PENDING = "pending"  # its job still waits or runs
    KEPT = "kept"  # the voice names it
    ORPHANED = "orphaned"  # nothing names it, nothing will


def note_upload(connection: redis.Redis, upload: VoiceUpload, *, at: float) -> None:
    """Before the recording is written: housekeeping looks at it from `at` (epoch seconds)."""
    connection.zadd(keys.VOICE_UPLOADS, {upload.member(): at})


def forget_upload(connection: redis.Redis, upload: VoiceUpload) -> None:
    """The recording was deleted by its writer itself (its job refused for room)."""
    connection.zrem(keys.VOICE_UPLOADS, upload.member())


def settle_upload(connection: redis.Redis | None, upload: VoiceUpload) -> None:
    """Its add-voice job settled the upload (the voice names it, or it was refused for good and
    deleted): the note goes now, not a grace later, so the owner's voice name is kept no longer
    than needed. A Redis blip leaves it to the sweep, which judges it the same way."""
    if connection is None:
        return
    try:
        forget_upload(connection, upload)
    except REDIS_OUTAGE as e:
        log.warning("voice_upload_note_kept", job_id=upload.job_id, error=str(e))


def due_uploads(connection: redis.Redis, now: float, batch: int) -> list[bytes]:
    """The oldest notes whose time has come (raw members, at most `batch`)."""
    due = connection.zrangebyscore(keys.VOICE_UPLOADS, "-inf", now, start=0, num=batch)
    return cast(list[bytes], due)


def judge(connection: redis.Redis, upload: VoiceUpload) -> Verdict:
    """What becomes of the recording (see the module docstring). The job's status is read
    first: a job that ended registered its voice before, so the voice is then seen."""
    status = connection.hget(Job.key_for(upload.job_id), "status")
    if status is not None and as_text(status) in PENDING_STATES:
        return Verdict.PENDING
    try:
        summary = VoiceRegistry(connection, upload.owner).load(upload.name).summary
    except UnknownVoiceError:
        return Verdict.ORPHANED
    except InvalidRequestError:
        return Verdict.KEPT  # a profile it cannot read may name it: never deleted on a guess
    return Verdict.KEPT if summary.source_uri == upload.uri else Verdict.ORPHANED
