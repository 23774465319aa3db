"""Submitting a document: validate, split, and enqueue it whole or not at all.

`submit_document` writes the plan, its jobs hash, its idempotency key's claim
(`producer.idempotency`, the plan standing for a job's hash) and every segment's job in one
transaction through the client's own submit path (`PlanWrites` is that transaction's prelude):
a front killed at any point leaves the document and its key, or neither. A key that names a
document that exists answers with that document's id (`KeyHeld`); one whose document is gone
is free again. `producer/documents.py` says the rest.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from redis.client import Pipeline

from producer.documents import CosyqClient
from producer.idempotency import claim, holders
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
from shared.settings import Settings
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
    try:
        _enqueue_document(client, plan, document_id, output_key)
    except KeyHeld as held:
        return held.holder
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
    client: CosyqClient, plan: DocumentPlan, document_id: str, output_key: str
) -> None:
    """The plan, its jobs hash, its idempotency key's claim and every segment's job in one
    transaction (within the quota); KeyHeld when the key names a document that exists."""
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
    claims = []
    if request.idempotency_key is not None:
        claims = [(idempotency_key(request.idempotency_key, client.tenant), document_id)]
    plan_writes = PlanWrites(record, [job.job_id for job in planned], client.settings, claims)
    client.submit_planned(planned, whole=True, prelude=plan_writes)


class KeyHeld(Exception):
    """The document's idempotency key names a document that exists: `holder`."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


@dataclass(frozen=True)
class PlanWrites:
    """The document's own writes in its segments' transaction (producer.planned.Prelude)."""

    record: DocumentPlanRecord
    job_ids: list[str]
    settings: Settings
    claims: list[tuple[str, str]]  # its idempotency key's (Redis key, document id), if any

    def check(self, pipe: Pipeline) -> None:
        """KeyHeld when another document that exists holds the key (WATCHed from here)."""
        grace_s = self.settings.idempotency_claim_grace_s
        if self.claims:
            pipe.watch(*(key for key, _ in self.claims))
        found = holders(pipe, self.claims, grace_s=grace_s, prefix=document_key(""))
        if found and found[0] is not None:
            raise KeyHeld(found[0])

    def write(self, pipe: Pipeline) -> None:
        """The plan, the key's claim, and the document in the operator page's index
        (shared/job_index.py)."""
        ttl, tenant = self.settings.result_ttl_s, self.record.tenant or DEFAULT_TENANT
        save_plan(pipe, self.record, self.job_ids, ttl)
        # the id alone: a front of an earlier release (a rolling upgrade, a rollback) answers
        # a resubmit with the key's whole value, which must then be the document's id
        claim(pipe, self.claims, ttl_s=self.settings.idempotency_ttl_s, stamped=False)
        index_document(pipe, tenant, self.record.document_id, keep_s=ttl)
