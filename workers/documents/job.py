"""The assembly job (`workers.documents.assemble_document`) and the segment hook.

Where assembly runs: the worker whose segment job records the document's last segment
(`record_finished_segment`, called by `workers.tasks.finish_synthesis`) enqueues one ordinary
RQ job on the document's queue. Any cosyq worker takes it (it is allow-listed in
`workers.service.admission`; a batching worker runs it alone, like add_voice). It needs no model:
it reads the stored segments one at a time, writes the file, manifest and captions, and records
the `DocumentResult`. `AssemblyClaim` makes it exactly one writer; a second assembler waits for
the first's result, or takes over when the first's claim lapses.
"""

from __future__ import annotations

import hashlib
import json
import socket
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import redis
from rq import get_current_job

from shared.audio import CONTENT_TYPES
from shared.captions import render
from shared.document_events import document_finished
from shared.document_outputs import document_own_folder, outputs_of, remember_outputs
from shared.document_state import (
    DocumentPlanRecord,
    DocumentResult,
    SegmentDone,
    assembly_enqueued,
    document_key,
    document_verdict,
    done_segments,
    enqueue_assembly,
    load_plan,
    load_result,
    new_assembly_job_id,
    note_segments_pending,
    record_segment,
    segments_deleted,
    segments_forgotten,
)
from shared.errors import InvalidRequestError, ObjectNotFoundError, TransientError
from shared.logs import get_logger
from shared.output_keys import check_document_keys
from shared.results import SynthesisResult
from shared.settings import Settings
from shared.storage import DOCUMENT_ID_METADATA, Storage
from shared.tenants import DEFAULT_TENANT
from shared.webhooks import allowed_prefixes
from workers.documents.audio import AssembledAudio, write_document
from workers.documents.claim import AssemblyClaim
from workers.service.job_context import JobContext

log = get_logger(__name__)
WAIT_POLL_S = 0.5  # how often a waiting assembler looks for the result or a free claim


def assemble_document(document_id: str) -> dict[str, Any]:
    """RQ entry point: assemble one document; returns its DocumentResult as JSON."""
    from workers.service.job_runtime import current_runtime  # noqa: PLC0415

    job = get_current_job()
    if job is None:
        raise RuntimeError("workers.documents.assemble_document runs only as an RQ job")
    runtime = current_runtime()
    tenant = JobContext.from_job(job).scope_tenant
    result = assemble(
        job.connection,
        runtime.storage,
        runtime.settings,
        document_id,
        runtime.worker_name,
        tenant=tenant,
    )
    return result.model_dump(mode="json")


def assemble(
    connection: redis.Redis,
    storage: Storage,
    settings: Settings,
    document_id: str,
    owner: str,
    *,
    tenant: str | None = None,
) -> DocumentResult:
    """The document's result: the existing one, or one this call writes under the claim.
    `tenant`: the assembly job's own (None: the plan's); the plan's keys are checked against
    it before anything is written or deleted (InvalidRequestError)."""
    deadline = time.monotonic() + settings.job_timeout_s
    claim = AssemblyClaim(
        connection, document_key(document_id, "claim"), owner, settings.document_claim_ttl_s
    )
    while True:
        existing = load_result(connection, document_id)
        if existing is not None:
            return existing
        if claim.acquire():
            break
        if time.monotonic() > deadline:
            raise TransientError(f"document {document_id}: another assembler holds the claim")
        time.sleep(WAIT_POLL_S)
    with claim:
        plan = load_plan(connection, document_id)
        check_plan_keys(plan, tenant)
        done = _all_done(connection, plan)
        result = _write(
            connection, storage, settings, plan=plan, done=done, claim=claim, owner=owner
        )
    log.info("document_assembled", document_id=document_id, segments=len(done))
    if not settings.document_keep_segments:
        delete_segments(connection, storage, plan)
    return result


def delete_segments(connection: redis.Redis, storage: Storage, plan: DocumentPlanRecord) -> None:
    """Delete the segments' audio of a document whose file is published, then its note and
    its record (a crash in between leaves both: `workers.documents.cleanup` deletes them
    later, `workers.documents.expiry` at the latest when its plan expires). The plan's keys
    were checked (`check_plan_keys`)."""
    for segment in plan.segments:
        storage.delete(segment.key)
    folder = document_own_folder(plan.document_id, plan.tenant)
    storage.remove_empty_folder(folder + "segments/")
    storage.remove_empty_folder(folder)  # a named file's document: nothing left in it
    segments_deleted(connection, plan.document_id)
    segments_forgotten(connection, plan.document_id)


def check_plan_keys(plan: DocumentPlanRecord, tenant: str | None) -> None:
    """The plan is the job's tenant's, and names only keys its tenant may write (the worker's
    check of a plan anyone who can write to Redis could have rewritten)."""
    owner = plan.tenant or DEFAULT_TENANT  # a plan from before tenants: the root's layout
    if tenant is not None and owner != tenant:
        raise InvalidRequestError(
            f"document {plan.document_id}: its plan's tenant {owner!r} is not the assembly "
            f"job's tenant {tenant!r}"
        )
    segments = [(s.index, s.key) for s in plan.segments]
    check_document_keys(owner, plan.document_id, plan.output_key, segments)


def _all_done(connection: redis.Redis, plan: DocumentPlanRecord) -> list[SegmentDone]:
    done = done_segments(connection, plan.document_id)
    missing = [s.index for s in plan.segments if s.index not in done]
    if missing:
        shown = ", ".join(str(i) for i in missing[:10])
        raise InvalidRequestError(
            f"document {plan.document_id}: segments {shown} are not done "
            f"({len(missing)} of {len(plan.segments)})"
        )
    for segment in plan.segments:
        _check_segment_uri(plan.document_id, segment.index, segment.key, done[segment.index].uri)
    return [done[s.index] for s in plan.segments]


def _check_segment_uri(document_id: str, index: int, key: str, uri: str) -> None:
    """The recorded audio of a segment is its own key's object (the URI's path ends with the
    key, under whatever storage root wrote it): a done hash rewritten in Redis cannot make the
    assembler read another tenant's audio or any other file into a document."""
    if not unquote(urlsplit(uri).path).endswith("/" + key):
        raise InvalidRequestError(
            f"document {document_id}: segment {index}'s recorded audio {uri!r} is not its "
            f"key {key!r}"
        )


def _write(
    connection: redis.Redis,
    storage: Storage,
    settings: Settings,
    *,
    plan: DocumentPlanRecord,
    done: list[SegmentDone],
    claim: AssemblyClaim,
    owner: str,
) -> DocumentResult:
    def read(uri: str) -> bytes:
        try:
            return storage.get(uri)
        except ObjectNotFoundError as e:
            index = next(i for i, d in enumerate(done) if d.uri == uri)
            connection.hdel(document_key(plan.document_id, "done"), str(index))
            raise InvalidRequestError(
                f"document {plan.document_id}: segment {index}'s audio is gone ({uri}); "
                "`cosyq document retry` synthesizes it again"
            ) from e

    with tempfile.TemporaryDirectory(prefix="cosyq-document-") as folder:
        path = Path(folder) / f"document.{plan.format}"
        audio = write_document(
            path,
            zip(plan.segments, done, strict=True),
            count=len(done),
            read=read,
            fmt=plan.format,
            sample_format=plan.sample_format,
            sample_rate=plan.sample_rate,
        )
        digest = _sha256(path)
        if not claim.held():
            raise TransientError(f"document {plan.document_id}: lost the assembly claim")
        metadata = {DOCUMENT_ID_METADATA: plan.document_id, "sha256": digest}
        metadata["duration-s"] = f"{audio.duration_s:.3f}"
        key = f"{plan.output_key}.{plan.format}"
        stored = storage.put_file(key, path, CONTENT_TYPES[plan.format], metadata)
    uris = _side_files(storage, plan, audio, stored.uri, done)
    verdict, suspect = document_verdict(dict(enumerate(done)))
    result = DocumentResult(
        document_id=plan.document_id,
        uri=stored.uri,
        manifest_uri=uris["json"],
        srt_uri=uris["srt"],
        vtt_uri=uris["vtt"],
        bytes=stored.bytes,
        sha256=digest,
        format=plan.format,
        sample_rate=plan.sample_rate,
        duration_s=audio.duration_s,
        segments=len(done),
        assembled_at=datetime.now(UTC).isoformat(),
        assembler=owner or socket.gethostname(),
        metadata=dict(plan.metadata),
        verdict=verdict,
        suspect_segments=suspect,
    )
    return _publish(connection, settings, plan, result)


def _publish(
    connection: redis.Redis, settings: Settings, plan: DocumentPlanRecord, result: DocumentResult
) -> DocumentResult:
    """The result and its `document.finished` event in one MULTI: both, or neither (and the
    note that its segments' audio is to be deleted, unless it is kept, and the record that
    deletes its outputs once the result has expired: shared/document_outputs.py)."""
    with connection.pipeline() as pipe:
        key = document_key(plan.document_id, "result")
        pipe.set(key, result.model_dump_json(), ex=settings.result_ttl_s)
        allowed = allowed_prefixes(settings.webhook_allowed_urls)
        document_finished(pipe, plan, result, allowed, settings.webhook_allow_private)
        if not settings.document_keep_segments:
            note_segments_pending(pipe, plan.document_id)
        remember_outputs(pipe, settings, plan.document_id, outputs_of(plan, settings))
        pipe.execute()
    return result


def _side_files(
    storage: Storage,
    plan: DocumentPlanRecord,
    audio: AssembledAudio,
    uri: str,
    done: list[SegmentDone],
) -> dict[str, str]:
    """The manifest (JSON) and the SRT and WebVTT captions beside the file."""
    verdict, suspect = document_verdict(dict(enumerate(done)))
    manifest = {
        "document_id": plan.document_id,
        "uri": uri,
        "format": plan.format,
        "sample_rate": plan.sample_rate,
        "duration_s": audio.duration_s,
        "verdict": verdict,
        "suspect_segments": suspect,
        "segments": [
            {
                "index": s.index,
                "text": s.text,
                "start_s": s.start_s,
                "end_s": s.end_s,
                "job_id": s.job_id,
                "verdict": d.verdict,
                "reasons": d.reasons,
            }
            for s, d in zip(audio.segments, done, strict=True)
        ],
        "captions": [{"start_s": c.start_s, "end_s": c.end_s, "text": c.text} for c in audio.cues],
    }
    files = {
        "json": (json.dumps(manifest, ensure_ascii=False, indent=1), "application/json"),
        "srt": (render(audio.cues, "srt"), "application/x-subrip"),
        "vtt": (render(audio.cues, "vtt"), "text/vtt"),
    }
    uris = {}
    for ext, (text, content_type) in files.items():
        data = text.encode()
        meta = {DOCUMENT_ID_METADATA: plan.document_id, "sha256": hashlib.sha256(data).hexdigest()}
        stored = storage.put(f"{plan.output_key}.{ext}", data, content_type, meta)
        uris[ext] = stored.uri
    return uris


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def record_finished_segment(
    connection: redis.Redis,
    settings: Settings,
    document: tuple[str, int],
    result: SynthesisResult,
) -> None:
    """A segment job stored its audio: record it; the last one enqueues the assembly."""
    document_id, index = document
    done = SegmentDone(
        job_id=result.job_id,
        uri=result.uri,
        duration_s=result.duration_s,
        attempt=result.attempt,
        pieces=list(result.pieces),
        verdict=result.quality.verdict if result.quality is not None else None,
        reasons=list(result.quality.reasons) if result.quality is not None else [],
    )
    assembly_id = new_assembly_job_id(document_id)  # used only when this one is last
    outcome = record_segment(
        connection,
        document_id,
        index,
        done,
        ttl_s=settings.result_ttl_s,
        assembly_job_id=assembly_id,
    )
    if outcome == 1:
        plan = load_plan(connection, document_id)
        enqueue_assembly(
            connection, settings, document_id, assembly_id, plan.priority, tenant=plan.tenant
        )
        assembly_enqueued(connection, document_id)
    if outcome == -1:
        log.warning("document_segment_superseded", document_id=document_id, segment=index)
