"""Erase a job or a document now (`client.erase`, `client.erase_document`, `cosyq erase`,
`DELETE /v1/jobs/{id}?erase=true`, `DELETE /v1/documents/{id}?erase=true`): a tenant's request
to forget what it asked for cannot wait for COSYQ_RESULT_TTL_S.

One that has not ended is canceled first; one still running after its cancel (a job stopping
at its next step, a segment stopping, an assembly writing) is refused with
`StillRunningError`, nothing erased: erase it again once it has stopped (a running writer
could otherwise store its audio after the erasure). Then, storage first (so a storage failure
leaves everything in Redis for the next try): the stored audio at keys cosyq chose, and a
caller's `output_key` only when `output_key=True` asks for it, each only while it is still this
job's or document's (`Storage.job_of`, `Storage.document_of`: a key a later job reused holds
that job's audio), in what its tenant owns (`owns_key`, keys derived as the workers derive them
for a document). Then Redis: the job's hash (its text, result and failure), its registries'
entries, its audio stream, its audio record, its idempotency key, its keyed cancels'
verdicts (`cancel_records`); a document's plan, its segment jobs, its assembly job, result,
records and idempotency key; every copy of its webhook events (producer/webhooks/forget.py:
not delivered after the erasure). What stays until its own retention holds ids only, never
text or audio: the operator page's indexes and the submitted set (an erasure makes no
event). Erasing again answers
as for an id never made (JobNotFoundError, DocumentNotFoundError): nothing of it is left.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, cast

import redis
from rq.job import Job

from producer.cancel import ENDED_STATES, CancelOutcome
from producer.tracking import JobTracker, job_status, tenant_of_job
from producer.webhooks.forget import forget_document_events, forget_job_events
from shared import document_state as state
from shared import keys
from shared.document_outputs import (
    OUTPUT_RECORDS,
    OUTPUTS_DUE,
    document_own_folder,
    output_keys,
    outputs_of,
)
from shared.errors import JobNotFoundError, StillRunningError
from shared.output_keys import owns_key
from shared.settings import Settings
from shared.storage import Storage, open_storage, stored_key
from shared.tenants import DEFAULT_TENANT


class CosyqClient(Protocol):
    """What an erasure needs of `producer.client.CosyqClient` (named here, so the client can
    import this module without the two importing each other)."""

    connection: redis.Redis
    settings: Settings
    tracker: JobTracker
    tenant: str

    def cancel(self, job_id: str, *, tell: bool = True) -> CancelOutcome: ...

    def cancel_document(self, document_id: str) -> dict[int, CancelOutcome]: ...


DOCUMENT_PARTS = ("", "jobs", "done", "assembly", "claim", "result", "event", "event-seq")


@dataclass
class Erasure:
    """What an erasure deleted: the stored objects' URIs, and those it kept (a caller's
    `output_key` not asked for)."""

    id: str
    kind: Literal["job", "document"]
    deleted: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {"id": self.id, "kind": self.kind, "deleted": self.deleted, "kept": self.kept}


def erase_job(
    client: CosyqClient,
    job_id: str,
    *,
    output_key: bool = False,
    storage: Storage | None = None,
    any_tenant: bool = False,
) -> Erasure:
    """Erase one of the client's tenant's jobs (see the module docstring); `any_tenant`: a job
    of any tenant or of nobody, as an operator (the CLI)."""
    job = _owned_job(client, job_id, any_tenant)
    if _state(job) not in ENDED_STATES | {"canceled"}:
        if client.cancel(job_id).verdict == "stopping":
            raise StillRunningError(f"job {job_id} is stopping: erase it again once it has")
        job = _owned_job(client, job_id, any_tenant)
    erasure = Erasure(job_id, "job")
    result = job_status(job).result
    if result is not None:
        _erase_audio(
            client,
            storage or open_storage(client.settings),
            job,
            result.uri,
            erasure,
            output_key=output_key,
        )
    request = job.kwargs.get("request") if isinstance(job.kwargs, dict) else None
    idem = request.get("idempotency_key") if isinstance(request, dict) else None
    tenant = tenant_of_job(job) or DEFAULT_TENANT
    run = job.meta.get(keys.RUN_META_KEY, 1)
    memory_s = int(client.settings.webhook_event_memory_hours * 3600)
    runs = run if isinstance(run, int) else 1
    forget_job_events(client.connection, job_id, tenant_of_job(job) or "", runs, memory_s)
    cancels = cancel_records(client.connection, [job_id])
    with client.connection.pipeline() as pipe:
        if isinstance(idem, str):
            _drop_if_names(client, keys.idempotency_key(idem, tenant), job_id)
        job.delete(pipeline=pipe, remove_from_queue=True)
        pipe.delete(keys.audio_stream_key(job_id), keys.CANCEL_PREFIX + job_id, *cancels)
        pipe.hdel(keys.AUDIO_RECORDS, job_id)
        pipe.zrem(keys.AUDIO_DUE, job_id)
        pipe.execute()
    return erasure


def cancel_records(connection: redis.Redis, job_ids: list[str]) -> list[str]:
    """The verdicts of the jobs' keyed cancels (kept for their retries: the job's id and how
    it was canceled) and the indexes that name them (`keys.cancel_records_key`)."""
    with connection.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.smembers(keys.cancel_records_key(job_id))
        found = pipe.execute()
    names = [keys.cancel_records_key(job_id) for job_id in job_ids]
    for job_id, digests in zip(job_ids, found, strict=True):
        for digest in digests:
            text = digest.decode() if isinstance(digest, bytes) else str(digest)
            names.append(keys.cancel_idempotency_key(job_id, text))
    return names


def _owned_job(client: CosyqClient, job_id: str, any_tenant: bool) -> Job:
    job = client.tracker.fetch(job_id)
    if not any_tenant and (tenant_of_job(job) or DEFAULT_TENANT) != client.tenant:
        raise JobNotFoundError(f"no job {job_id} (never submitted, or expired)")
    return job


def _state(job: Job) -> str:
    found = job.get_status(refresh=False)
    return found.value if found is not None else "unknown"


def _erase_audio(
    client: CosyqClient, storage: Storage, job: Job, uri: str, erasure: Erasure, *, output_key: bool
) -> None:
    key = stored_key(storage.base_uri, uri)
    if key is None or not owns_key(tenant_of_job(job) or DEFAULT_TENANT, key):
        return  # not where this storage writes its tenant's audio: nothing of ours to delete
    if storage.job_of(key) != job.id:
        return  # gone, or a later job's (a reused output_key): not this job's any more
    request = job.kwargs.get("request") if isinstance(job.kwargs, dict) else None
    named = isinstance(request, dict) and request.get("output_key") is not None
    if named and not output_key:
        erasure.kept.append(uri)
        return
    storage.delete(key)
    erasure.deleted.append(uri)


def _drop_if_names(client: CosyqClient, key: str, owner_id: str) -> None:
    held = client.connection.get(key)  # "<id> <claimed at> <enqueued at>", or "<id>"
    text = held.decode() if isinstance(held, bytes) else held
    if text is not None and text.split(" ", 1)[0] == owner_id:
        client.connection.delete(key)


def erase_document(
    client: CosyqClient,
    document_id: str,
    *,
    output_key: bool = False,
    storage: Storage | None = None,
    any_tenant: bool = False,
) -> Erasure:
    """Erase one of the client's tenant's documents (see the module docstring); `any_tenant`:
    one of any tenant or of nobody, as an operator (the CLI)."""
    connection = client.connection
    plan = state.load_plan(connection, document_id)  # DocumentNotFoundError
    if not any_tenant and (plan.tenant or DEFAULT_TENANT) != client.tenant:
        raise state.not_found(document_id)
    _stop_document(client, document_id)
    storage = storage or open_storage(client.settings)
    erasure = Erasure(document_id, "document")
    kept = len(plan.segments)
    found = output_keys(
        document_id,
        outputs_of(plan, client.settings).model_copy(update={"kept_segments": kept}),
        client.settings.max_document_segments,
    )
    for key in found.own:
        if storage.document_of(key) == document_id or storage.job_of(key) is not None:
            erasure.deleted.append(storage.uri_for(key))
        storage.delete(key)
    folder = document_own_folder(document_id, plan.tenant)
    storage.remove_empty_folder(folder + "segments/")
    storage.remove_empty_folder(folder)
    for key in found.named:
        if storage.document_of(key) != document_id:
            continue  # not there, or a later job's or document's
        if not output_key:
            erasure.kept.append(storage.uri_for(key))
            continue
        storage.delete(key)
        erasure.deleted.append(storage.uri_for(key))
    _forget_document(client, document_id, plan)
    forget_document_events(client.connection, document_id)
    return erasure


def _stop_document(client: CosyqClient, document_id: str) -> None:
    """Cancel what has not run; StillRunningError while a segment or its assembly runs."""
    outcomes = client.cancel_document(document_id)
    running = [i for i, outcome in outcomes.items() if outcome.verdict == "stopping"]
    assembly = state.assembly_job_id(client.connection, document_id)
    if assembly is not None and client.tracker.states([assembly])[0] in ("queued", "deferred"):
        client.cancel(assembly)  # it never runs
    # an assembler that published the result only deletes segments now: nothing it writes
    assembled = client.connection.exists(state.document_key(document_id, "result"))
    writing = client.connection.exists(state.document_key(document_id, "claim"))
    started = assembly is not None and client.tracker.states([assembly])[0] == "started"
    if running or (not assembled and (writing or started)):
        raise StillRunningError(f"document {document_id} is stopping: erase it again once it has")


def _forget_document(client: CosyqClient, document_id: str, plan: state.DocumentPlanRecord) -> None:
    connection = client.connection
    job_ids = list(state.job_ids(connection, document_id).values())
    assembly = state.assembly_job_id(connection, document_id)
    if plan.idempotency_key is not None:
        tenant = plan.tenant or DEFAULT_TENANT
        _drop_if_names(client, state.idempotency_key(plan.idempotency_key, tenant), document_id)
    jobs = []
    every_id = [*job_ids, *([assembly] if assembly else [])]
    for job_id in every_id:
        try:
            jobs.append(client.tracker.fetch(job_id))
        except JobNotFoundError:
            continue  # expired already
    cancels = cancel_records(connection, every_id)
    with connection.pipeline() as pipe:
        if cancels:
            pipe.delete(*cancels)
        for job in jobs:
            job.delete(pipeline=pipe, remove_from_queue=True)
            pipe.delete(keys.audio_stream_key(job.id), keys.CANCEL_PREFIX + job.id)
            pipe.hdel(keys.AUDIO_RECORDS, job.id)
            pipe.zrem(keys.AUDIO_DUE, job.id)
        pipe.delete(*(state.document_key(document_id, part) for part in DOCUMENT_PARTS))
        pipe.hdel(state.SEGMENT_RECORDS, document_id)
        pipe.hdel(OUTPUT_RECORDS, document_id)
        for pending in (
            state.SEGMENTS_DUE,
            OUTPUTS_DUE,
            state.SEGMENTS_PENDING,
            state.ASSEMBLY_PENDING,
            state.LIVE_DOCUMENTS,
        ):
            pipe.zrem(pending, document_id)
        pipe.execute()


class Erasing:
    """`CosyqClient.erase` and `erase_document` (the client's own module is at its size)."""

    def erase(self, job_id: str, *, output_key: bool = False, any_tenant: bool = False) -> Erasure:
        """Erase one of this tenant's jobs now: canceled if it has not ended, then its stored
        audio at the key cosyq chose (a caller's `output_key` only with `output_key=True`),
        its text, result and keys in Redis. StillRunningError while it is stopping;
        JobNotFoundError for an unknown id, another tenant's (unless `any_tenant`, as an
        operator: `cosyq erase`), or one erased already."""
        client = cast("CosyqClient", self)
        return erase_job(client, job_id, output_key=output_key, any_tenant=any_tenant)

    def erase_document(
        self, document_id: str, *, output_key: bool = False, any_tenant: bool = False
    ) -> Erasure:
        """Erase one of this tenant's documents now, as `erase` erases a job: its segments,
        file, manifest and captions (those at a caller's `output_key` only with
        `output_key=True`), its plan, jobs and result in Redis."""
        client = cast("CosyqClient", self)
        return erase_document(client, document_id, output_key=output_key, any_tenant=any_tenant)
