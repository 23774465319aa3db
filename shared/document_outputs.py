"""What an assembled document left in storage, and the record that says so once it is gone.

An assembled document writes its file, manifest and captions (`<key>.<format>`, `.json`,
`.srt`, `.vtt`) and, under COSYQ_DOCUMENT_KEEP_SEGMENTS, keeps its segments' audio. They were
kept for ever: once the document's keys expire nothing names them. The assembler therefore
writes, in the MULTI that publishes the result, a record that outlives it:

    cosyq:document-output-records  hash: document id -> DocumentOutputsRecord (its tenant, the
                                   file's key without extension, its format, how many segments'
                                   audio it kept), no TTL
    cosyq:document-outputs-due     sorted set: document id -> the result's expiry, as known then

and every worker's housekeeping (`workers.documents.outputs_expiry`) deletes what
COSYQ_AUDIO_RETENTION says once the document is gone: the files at keys cosyq chose (the
document's own folder, `documents/<id>/`) under `unnamed` and `with_result`; the files at a
caller's `output_key` under `with_result` only (its product under `unnamed`); nothing under
`keep` (no record is written then).

The keys deleted are derived from the record as the assembler wrote them, after the same
checks as the assembler's (`check_document_keys`): the document's own folder is its alone; a
caller's key is deleted only while the file there is still this document's (its note, its S3
object's `document-id`), never a later job's or document's that reused the key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, get_args

import redis
from pydantic import BaseModel, ConfigDict, Field

from shared.document_state import DocumentPlanRecord
from shared.documents import document_folder, segment_key
from shared.errors import InvalidRequestError
from shared.keys import JOB_ID_RE, PREFIX
from shared.output_keys import check_document_keys, tenant_prefix
from shared.results import AudioFormat
from shared.settings import Settings
from shared.tenants import DEFAULT_TENANT, check_tenant_name

OUTPUT_RECORDS = PREFIX + "document-output-records"  # see the module docstring
OUTPUTS_DUE = PREFIX + "document-outputs-due"  # see the module docstring
OUTPUT_EXPIRY_LOCK = PREFIX + "document-output-expiry-lock"  # one deleter per tick
SIDE_FILES = ("json", "srt", "vtt")  # the manifest and the captions beside the file


class DocumentOutputsRecord(BaseModel):
    """What deleting an assembled document's outputs needs once its keys are gone."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    tenant: str | None = None  # the plan's (None: a plan from before tenants, the root's)
    output_key: str  # the file's key without extension, as the plan names it
    format: str
    kept_segments: int = Field(default=0, ge=0)  # segments' audio kept (KEEP_SEGMENTS), or 0


@dataclass(frozen=True)
class OutputKeys:
    """The keys of a document's outputs: its own (in its folder) and a caller's."""

    own: list[str]
    named: list[str]


def output_keys(document_id: str, record: DocumentOutputsRecord, max_segments: int) -> OutputKeys:
    """The document's output keys, checked as its assembler checks a plan's; InvalidRequestError
    when the record cannot be a document's (its id, tenant or format not one, a key outside
    what its tenant may write, more segments than a document may have)."""
    if not JOB_ID_RE.fullmatch(document_id):
        raise InvalidRequestError(f"document {document_id!r}: not a document id")
    owner = DEFAULT_TENANT if record.tenant is None else check_tenant_name(record.tenant)
    if record.format not in get_args(AudioFormat) or record.kept_segments > max_segments:
        raise InvalidRequestError(f"document {document_id}: not a document's outputs record")
    prefix = tenant_prefix(owner)
    segments = [prefix + segment_key(document_id, i) for i in range(record.kept_segments)]
    check_document_keys(owner, document_id, record.output_key, enumerate(segments))
    files = [f"{record.output_key}.{ext}" for ext in (record.format, *SIDE_FILES)]
    if record.output_key.startswith(prefix + document_folder(document_id)):
        return OutputKeys(own=files + segments, named=[])
    return OutputKeys(own=segments, named=files)


def outputs_of(plan: DocumentPlanRecord, settings: Settings) -> DocumentOutputsRecord:
    """What the document's assembly leaves in storage."""
    kept = len(plan.segments) if settings.document_keep_segments else 0
    return DocumentOutputsRecord(
        tenant=plan.tenant, output_key=plan.output_key, format=plan.format, kept_segments=kept
    )


def document_own_folder(document_id: str, tenant: str | None) -> str:
    """The document's own folder, as a key prefix ending in "/"."""
    return tenant_prefix(tenant or DEFAULT_TENANT) + document_folder(document_id)


def deletes_anything(settings: Settings, document_id: str, record: DocumentOutputsRecord) -> bool:
    """Whether COSYQ_AUDIO_RETENTION deletes any of these outputs once they expire."""
    if settings.audio_retention == "keep":
        return False
    own = record.output_key.startswith(document_own_folder(document_id, record.tenant))
    return own or record.kept_segments > 0 or settings.audio_retention == "with_result"


def remember_outputs(
    target: Any, settings: Settings, document_id: str, record: DocumentOutputsRecord
) -> None:
    """Record the outputs (queued on `target`, a pipeline or a connection), to be looked at
    once the result expires; nothing when the retention deletes none of them."""
    if not deletes_anything(settings, document_id, record):
        return
    target.hset(OUTPUT_RECORDS, document_id, record.model_dump_json())
    target.zadd(OUTPUTS_DUE, {document_id: time.time() + settings.result_ttl_s})


def outputs_record(connection: redis.Redis, document_id: str) -> DocumentOutputsRecord | None:
    """The document's record (None: none, or one that does not read as a record)."""
    raw = connection.hget(OUTPUT_RECORDS, document_id)
    if raw is None:
        return None
    try:
        return DocumentOutputsRecord.model_validate_json(raw)
    except ValueError:
        return None


def due_outputs(connection: redis.Redis, count: int) -> list[str]:
    """Documents whose result's expiry, as last seen, has come."""
    found = connection.zrangebyscore(OUTPUTS_DUE, "-inf", time.time(), 0, count)
    return [d.decode() if isinstance(d, bytes) else str(d) for d in found]


def outputs_due_in(connection: redis.Redis, document_id: str, seconds: float) -> None:
    """Look at the document again in `seconds` (its keys still live)."""
    connection.zadd(OUTPUTS_DUE, {document_id: time.time() + seconds}, xx=True)


def outputs_forgotten(connection: redis.Redis, document_id: str) -> None:
    """The document's outputs are deleted, or left to whoever keeps them: the record goes."""
    with connection.pipeline() as pipe:
        pipe.hdel(OUTPUT_RECORDS, document_id)
        pipe.zrem(OUTPUTS_DUE, document_id)
        pipe.execute()
