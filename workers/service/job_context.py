"""The queue-side facts of one attempt of a job (`JobContext`), read from its RQ job: the one
place a job's tenant tag, document and cancel flag are read for the job functions."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import redis
from rq.job import Job

from shared import keys
from shared.document_state import DOCUMENT_META_KEY
from shared.tenants import DEFAULT_TENANT, TENANT_META_KEY, tenant_of_queue
from workers.engine.api import StopCheck
from workers.service.cancels import CancelFlag


@dataclass(frozen=True)
class JobContext:
    """The queue-side facts of one attempt."""

    job_id: str
    queue: str
    attempt: int
    enqueued_at: datetime | None
    started_at: datetime
    connection: redis.Redis | None = None  # the job's Redis: where a streamed job's chunks go
    timeout_s: float | None = None  # the job's own timeout (quality retries must fit in it)
    document: tuple[str, int] | None = None  # a document segment's (document id, index)
    should_stop: StopCheck | None = None  # its cancel flag (workers/service/cancels.py)
    # who submitted it (admission has checked the name); None when the job's meta has no
    # tenant tag (its hash re-created without meta): nobody's, never silently "default"
    tenant: str | None = DEFAULT_TENANT

    @classmethod
    def from_job(cls, job: Job, *, cancel_check_s: float = 0.1) -> JobContext:
        attempt = job.meta.get(keys.ATTEMPT_META_KEY, 1)
        flag = CancelFlag(job.connection, job.id, every_s=cancel_check_s)
        return cls(
            job_id=job.id,
            queue=job.origin,
            attempt=attempt if isinstance(attempt, int) and attempt >= 1 else 1,
            enqueued_at=job.enqueued_at,
            started_at=job.started_at or datetime.now(UTC),
            connection=job.connection,
            timeout_s=float(job.timeout) if isinstance(job.timeout, int | float) else None,
            document=_document_of(job.meta.get(DOCUMENT_META_KEY)),
            should_stop=flag if job.connection is not None else None,
            tenant=_tenant_of(job.meta.get(TENANT_META_KEY)),
        )

    @property
    def scope_tenant(self) -> str:
        """Whose voices the job may use and under whose storage prefix it writes: its tenant
        tag, else the tenant of the queue it came from (admission makes the two agree; an
        untagged job is never given "default"'s voices or keys unless it came from
        "default"'s queue)."""
        return self.tenant if self.tenant is not None else tenant_of_queue(self.queue)

    @property
    def queue_wait_s(self) -> float:
        if self.enqueued_at is None:
            return 0.0
        return max(0.0, (self.started_at - self.enqueued_at).total_seconds())


def _tenant_of(tag: object) -> str | None:
    return tag if isinstance(tag, str) else None


def _document_of(meta: object) -> tuple[str, int] | None:
    """(document id, segment index) from a segment job's meta; None for an ordinary job."""
    if not isinstance(meta, dict):
        return None
    document_id, index = meta.get("id"), meta.get("index")
    if isinstance(document_id, str) and isinstance(index, int) and index >= 0:
        return document_id, index
    return None
