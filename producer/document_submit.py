"""Submitting a document: validate, split, and enqueue it whole or not at all.

`submit_document` claims the document's idempotency key (`producer.idempotency`, the plan
standing for a job's hash: a key whose plan never went in, its submitter killed before the
transaction, is free again after `COSYQ_IDEMPOTENCY_CLAIM_GRACE_S`), then writes the plan, its
jobs hash, the key's mark that it went in and every segment's job in one transaction through
the client's own submit path (`producer/documents.py` says the rest).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from redis.client import Pipeline

from producer.documents import CosyqClient
from producer.idempotency import mark_enqueued
from producer.idempotency import release as release_idempotency_key
from producer.idempotency import reserve as reserve_idempotency_keys
from producer.planned import PlannedJob
from shared.document_state import (
    DOCUMENT_META_KEY,
    DocumentPlanRecord,
    SegmentPlan,
    document_key,
    idempotency_key,
    save_plan,
)
from shared.documents import (
    DocumentLimits,
    DocumentPlan,
    DocumentRequest,
    segment_key,
    segment_seed,
    validate_document,
)
from shared.documents import document_key as output_base_key
from shared.errors import InvalidRequestError
from shared.job_index import index_document
from shared.output_keys import place_output_key, tenant_prefix
from shared.tenants import DEFAULT_TENANT


def submit_document(client: CosyqClient, data: Mapping[str, Any]) -> str:
    """Validate, split and enqueue a document, whole or not at all; its id (the first one's
    for a key this tenant used before). Refused (quota, a full queue, Redis), nothing of it is
    left in Redis and its idempotency key is free again."""
    settings = client.settings
    plan = validate_document(data, DocumentLimits.from_settings(settings))
    request = plan.request
    document_id = uuid.uuid4().hex
    output_key = _output_key(client, document_id, request)
    claims: list[tuple[str, str]] = []
    if request.idempotency_key is not None:
        claims = [(idempotency_key(request.idempotency_key, client.tenant), document_id)]
        [holder] = reserve_idempotency_keys(
            client.connection,
            claims,
            ttl_s=settings.idempotency_ttl_s,
            grace_s=settings.idempotency_claim_grace_s,
            prefix=document_key(""),
        )
        if holder is not None:
            return holder
    try:
        _enqueue_document(client, plan, document_id, output_key, claims)
    except BaseException:
        for claim, _ in claims:
            release_idempotency_key(client.connection, claim, document_id)
        raise
    return document_id


def _output_key(client: CosyqClient, document_id: str, request: DocumentRequest) -> str:
    """The assembled file's key without extension, under the tenant's prefix."""
    base = output_base_key(document_id, request)
    if request.output_key is None:
        return tenant_prefix(client.tenant) + base
    try:
        return place_output_key(client.tenant, base, client.settings.max_output_key_chars)
    except ValueError as e:
        raise InvalidRequestError(f"output_key: {e}") from e


def _enqueue_document(
    client: CosyqClient,
    plan: DocumentPlan,
    document_id: str,
    output_key: str,
    claims: list[tuple[str, str]],
) -> None:
    """The plan, its jobs hash, the idempotency key's mark (`claims`) and every segment's job
    in one transaction (within the quota)."""
    request = plan.request
    seed = request.seed if request.seed is not None else int.from_bytes(os.urandom(4), "little")
    queue = client.queue_for(request.priority)
    prefix = tenant_prefix(client.tenant)
    segments, planned = [], []
    for segment, job in zip(plan.segments, plan.jobs, strict=True):
        key = prefix + segment_key(document_id, segment.index)
        seeded = job.model_copy(
            update={"seed": segment_seed(seed, segment.index), "output_key": key}
        )
        meta = {DOCUMENT_META_KEY: {"id": document_id, "index": segment.index}}
        planned.append(PlannedJob(segment.index, uuid.uuid4().hex, queue, seeded, meta))
        segments.append(
            SegmentPlan(
                index=segment.index,
                text=segment.text,
                plain=segment.plain,
                pause_before_s=segment.pause_before_s,
                seed=seeded.seed or 0,
                key=key,
            )
        )
    template = plan.jobs[0].model_dump(mode="json", exclude={"text", "seed", "output_key"})
    record = DocumentPlanRecord(
        document_id=document_id,
        created_at=datetime.now(UTC).isoformat(),
        seed=seed,
        job=template,
        format=request.format,
        sample_format=request.sample_format,
        sample_rate=request.sample_rate,
        output_key=output_key,
        priority=request.priority,
        idempotency_key=request.idempotency_key,
        tenant=client.tenant,
        metadata=dict(request.metadata),
        segments=segments,
    )
    ids, ttl = [job.job_id for job in planned], client.settings.result_ttl_s
    client.submit_planned(
        planned, whole=True, prelude=lambda pipe: _prelude(pipe, record, ids, ttl, claims)
    )


def _prelude(
    pipe: Pipeline,
    record: DocumentPlanRecord,
    ids: list[str],
    ttl: int,
    claims: list[tuple[str, str]],
) -> None:
    """The plan, the mark on its idempotency key that it went in (a key whose plan is then
    gone is free at once), and the document in the operator page's index (shared/job_index.py)."""
    save_plan(pipe, record, ids, ttl)
    mark_enqueued(pipe, claims)
    index_document(pipe, record.tenant or DEFAULT_TENANT, record.document_id, keep_s=ttl)
