"""One job as its page shows it, and the judgements on a suspect result.

accept: the result stands; fail: it is marked failed by a person (the audio stays where it is,
the judgement says not to use it); regenerate: the same request is submitted again with a new
seed through the producer's own path (`CosyqClient.submit` for the job's tenant: its quota, its
queues, its output prefix), and the judgement names the new job. Each is kept as JSON
(`keys.JUDGEMENT_PREFIX`) with who made it (tenant or operator, and the name given at sign-in,
never a key) and when, and takes the job out of the suspect queue.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from rq.job import Job

from producer.client import CosyqClient
from producer.tracking import JobStatus, tenant_of_job
from shared import keys
from shared.document_state import DOCUMENT_META_KEY
from shared.errors import InvalidRequestError
from shared.job_index import (
    JUDGEMENTS,
    claim_judgement,
    judgement_of,
    owned,
    release_judgement,
    save_judgement,
)

SEED_LIMIT = 2**31  # a request's seed is a non-negative 31-bit integer


@dataclass(frozen=True)
class JobView:
    status: JobStatus
    text: str  # the request's text as submitted ("" for other kinds of job)
    voice: str
    document: dict[str, Any] | None  # {"id", "index"} for a document's segment
    last_error: dict[str, Any] | None  # why an earlier attempt failed (retried jobs)
    judgement: dict[str, Any] | None

    @property
    def suspect(self) -> bool:
        result = self.status.result
        return (
            result is not None
            and result.quality is not None
            and (result.quality.verdict == "suspect")
        )


def job_view(client: CosyqClient, job: Job, status: JobStatus) -> JobView:
    request = job.kwargs.get("request") if job.func_name == keys.SYNTHESIZE_FUNCTION else None
    request = request if isinstance(request, dict) else {}
    document = job.meta.get(DOCUMENT_META_KEY)
    last_error = job.meta.get(keys.LAST_ERROR_META_KEY)
    return JobView(
        status=status,
        text=str(request.get("text") or ""),
        voice=str(request.get("voice") or ""),
        document=document if isinstance(document, dict) else None,
        last_error=last_error if isinstance(last_error, dict) else None,
        judgement=judgement_of(client.connection, status.job_id),
    )


def judge(client: CosyqClient, job: Job, view: JobView, action: str, who: str) -> dict[str, Any]:
    """Record `action` on the suspect job; regenerate submits the new job first."""
    if action not in JUDGEMENTS:
        raise InvalidRequestError(f"action: one of {', '.join(JUDGEMENTS)}, not {action!r}")
    if not view.suspect:
        raise InvalidRequestError(f"job {job.id}: only a suspect result is judged")
    if view.judgement is not None:  # a second click, or two people at once: the first stands
        raise InvalidRequestError(f"job {job.id}: already {view.judgement.get('action')}")
    tenant = tenant_of_job(job)
    record: dict[str, Any] = {"action": action, "by": who, "at": time.time()}
    keep_s = max(client.settings.result_ttl_s, client.settings.failure_ttl_s)
    if not claim_judgement(client.connection, job.id, record, keep_s=keep_s):
        raise InvalidRequestError(f"job {job.id}: someone judged it first")
    if action == "regenerated":
        try:
            record["new_job"] = regenerate(client, job, view, tenant)
        except BaseException:
            release_judgement(client.connection, job.id)  # nothing was submitted
            raise
    save_judgement(client.connection, job.id, tenant, record, keep_s=keep_s)
    return record


def regenerate(client: CosyqClient, job: Job, view: JobView, tenant: str | None) -> str:
    """The job's request again with a new seed, submitted as its tenant; the new job's id.
    A job of no tenant (nobody's) is refused: submitted as "default"'s, its text would be
    that tenant's to read."""
    if tenant is None:
        raise InvalidRequestError(f"job {job.id} has no tenant (nobody's): not regenerated")
    if view.document is not None:
        raise InvalidRequestError(
            f"job {job.id} is a segment of document {view.document.get('id')}: retry the document"
        )
    request = job.kwargs.get("request")
    if not isinstance(request, dict):
        raise InvalidRequestError(f"job {job.id}: not a synthesis job")
    fresh = {k: v for k, v in request.items() if k not in ("seed", "idempotency_key", "output_key")}
    old_seed = request.get("seed")
    seed = secrets.randbelow(SEED_LIMIT)
    while seed == old_seed:
        seed = secrets.randbelow(SEED_LIMIT)
    metadata = dict(fresh.get("metadata") or {})
    metadata["regenerated_from"] = job.id
    fresh.update(seed=seed, metadata=metadata)
    return client.for_tenant(tenant).submit(fresh)


def next_suspect(client: CosyqClient, tenant: str | None, after: str = "") -> str | None:
    """The oldest suspect waiting for a judgement (of `tenant`; None: any), other than `after`."""
    key = owned(keys.SUSPECT_INDEX, tenant)
    client.connection.zremrangebyscore(key, "-inf", time.time() - client.settings.result_ttl_s)
    ids: Any = client.connection.zrange(key, 0, 1)
    for raw in ids:
        job_id = raw.decode() if isinstance(raw, bytes) else str(raw)
        if job_id != after:
            return job_id
    return None
