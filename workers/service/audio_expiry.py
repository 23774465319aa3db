"""Delete a job's audio once its result has expired, as COSYQ_AUDIO_RETENTION says.

A result lives COSYQ_RESULT_TTL_S; its audio (and, in a folder, the note beside it) stayed in
storage for ever: once the job's hash is gone nothing names the file, so nobody could delete
it. The worker that stores a job's audio therefore writes a record beside it that outlives the
job (`cosyq:audio-records`: job id -> the key and the job's tenant) and when to look at it
(`cosyq:audio-due`: the result's expiry, as known then). Every worker's housekeeping runs
`ExpiredAudio` (one holder per tick, under a short lock): a record whose job still exists (a
manual requeue, a judgement's regeneration keep it) is looked at again at the job's expiry; one
whose job is gone has its audio deleted, then the record.

The key comes from Redis, so before deleting, the duty checks what the front checks before it
relays a file: the key lies in what the record's tenant owns (`owns_key`), and the object there
is still this job's own (an S3 object's job id; a file's note while it describes that very
file): an `output_key` reused by a later job of the tenant holds that job's audio, which this
record never deletes (the later job's own record does, at its expiry). An object that cannot
say whose it is (a file written before notes, or its note lost) is left where it is.
A document's segments are left to the document's own cleanup (workers/documents/).
"""

from __future__ import annotations

import json
import time

import redis
from rq.job import Job

from shared import keys
from shared.errors import StorageUnavailableError
from shared.logs import get_logger
from shared.output_keys import owns_key
from shared.settings import Settings
from workers.documents.duty import StorageDuty

log = get_logger(__name__)
EXPIRY_BATCH = 50  # records looked at per tick (the rest wait a tick)
NO_TTL = -1  # PTTL of a key that never expires
GONE = -2  # PTTL of a key that does not exist


def remember_audio(
    connection: redis.Redis,
    settings: Settings,
    job_id: str,
    key: str,
    tenant: str | None,
    *,
    named: bool,
) -> None:
    """Note where `job_id`'s audio is, to be deleted once the job has expired; nothing under
    `keep`, nor for a key its caller `named` (an output_key) under `unnamed`: a pipeline that
    names where its audio goes keeps it there (its product, not our cache)."""
    if settings.audio_retention == "keep" or (named and settings.audio_retention == "unnamed"):
        return
    record = json.dumps({"key": key, "tenant": tenant})
    with connection.pipeline() as pipe:
        pipe.hset(keys.AUDIO_RECORDS, job_id, record)
        pipe.zadd(keys.AUDIO_DUE, {job_id: time.time() + settings.result_ttl_s})
        pipe.execute()


class ExpiredAudio(StorageDuty):
    """A housekeeping duty: `tick()` once per heartbeat interval, one holder per tick."""

    lock_key = keys.AUDIO_EXPIRY_LOCK

    def tick(self) -> list[str]:
        """The jobs whose audio this tick deleted."""
        if not self.holds_this_tick():
            return []
        found = self.connection.zrangebyscore(keys.AUDIO_DUE, "-inf", time.time(), 0, EXPIRY_BATCH)
        deleted = []
        for raw in found if isinstance(found, list) else []:
            job_id = raw.decode() if isinstance(raw, bytes) else str(raw)
            try:
                if self._look(job_id):
                    deleted.append(job_id)
            except StorageUnavailableError as e:  # passing: the next tick tries again
                log.warning("job_audio_expiry_failed", job_id=job_id, error=str(e))
                break
        return deleted

    def _look(self, job_id: str) -> bool:
        left_ms = int(self.connection.pttl(Job.redis_job_namespace_prefix + job_id))
        if left_ms != GONE:  # still there: look again when it may have expired
            left_s = self.settings.result_ttl_s if left_ms == NO_TTL else left_ms / 1000
            self.connection.zadd(keys.AUDIO_DUE, {job_id: time.time() + left_s}, xx=True)
            return False
        key, tenant = _record(self.connection.hget(keys.AUDIO_RECORDS, job_id))
        deleted = False
        if key is None or not owns_key(tenant, key):
            log.error("job_audio_record_refused", job_id=job_id)
        elif self.settings.audio_retention == "keep":
            pass
        elif self.storage.job_of(key) == job_id:
            self.storage.delete(key)
            log.info("job_audio_expired", job_id=job_id)
            deleted = True
        with self.connection.pipeline() as pipe:
            pipe.hdel(keys.AUDIO_RECORDS, job_id)
            pipe.zrem(keys.AUDIO_DUE, job_id)
            pipe.execute()
        return deleted


def _record(raw: object) -> tuple[str | None, str | None]:
    """(key, tenant) of a record; (None, None) when it does not read as one."""
    try:
        fields = json.loads(raw) if isinstance(raw, bytes | str) else None
    except ValueError:
        return None, None
    if not isinstance(fields, dict) or not isinstance(fields.get("key"), str):
        return None, None
    tenant = fields.get("tenant")
    return fields["key"], tenant if isinstance(tenant, str) else None
