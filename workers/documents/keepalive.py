"""Keep a document alive while one of its jobs still waits or runs.

A document's plan, jobs and done keys live COSYQ_RESULT_TTL_S from its last progress (submit,
a segment started or recorded, a retry). A document whose segments wait in a deep queue (a busy
fleet, higher priorities served first) may make no progress for longer than that, while RQ
keeps its jobs waiting as long as it takes. So every worker's housekeeping runs this duty (one
holder per tick, under a short lock): a document noted live (`LIVE_DOCUMENTS`, by submit and
retry) whose TTL was last renewed a third of the TTL ago or more has its keys renewed when one
of its current jobs (or its assembly job) is still queued, scheduled, deferred or running, and
drops the note otherwise (all its jobs ended or gone: the TTL from its last progress then runs
out as before).
"""

from __future__ import annotations

import time

from rq.job import Job, JobStatus

from shared.document_state import (
    KEEPALIVE_LOCK,
    LIVE_DOCUMENTS,
    assembly_job_id,
    job_ids,
    renew,
)
from shared.logs import get_logger
from workers.documents.duty import LockedDuty

log = get_logger(__name__)
KEEPALIVE_BATCH = 50  # documents looked at per tick (the rest wait a tick)
WAITING = {
    JobStatus.QUEUED.value,
    JobStatus.SCHEDULED.value,
    JobStatus.DEFERRED.value,
    JobStatus.STARTED.value,
}


class DocumentKeepalive(LockedDuty):
    """A housekeeping duty: `tick()` once per heartbeat interval, one holder per tick."""

    lock_key = KEEPALIVE_LOCK

    def tick(self) -> list[str]:
        """The documents whose TTL this tick renewed."""
        if not self.holds_this_tick():
            return []
        ttl = self.settings.result_ttl_s
        due = self.connection.zrangebyscore(
            LIVE_DOCUMENTS, "-inf", time.time() - ttl / 3, 0, KEEPALIVE_BATCH
        )
        renewed = []
        for raw in due:
            document_id = raw.decode() if isinstance(raw, bytes) else str(raw)
            if self._waiting(document_id):
                with self.connection.pipeline() as pipe:
                    renew(pipe, document_id, ttl)
                    pipe.zadd(LIVE_DOCUMENTS, {document_id: time.time()})
                    pipe.execute()
                renewed.append(document_id)
            else:
                self.connection.zrem(LIVE_DOCUMENTS, document_id)
        if renewed:
            log.info("documents_kept_alive", documents=len(renewed))
        return renewed

    def _waiting(self, document_id: str) -> bool:
        """Whether one of the document's current jobs (its segments', its assembly's) still
        waits or runs."""
        jobs = list(job_ids(self.connection, document_id).values())
        assembly = assembly_job_id(self.connection, document_id)
        if assembly is not None:
            jobs.append(assembly)
        with self.connection.pipeline(transaction=False) as pipe:
            for job_id in jobs:
                pipe.hget(Job.key_for(job_id), "status")
            states = pipe.execute()
        return any(
            (s.decode() if isinstance(s, bytes) else s) in WAITING for s in states if s is not None
        )
