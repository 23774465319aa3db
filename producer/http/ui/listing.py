"""The /ui lists, read a page at a time: jobs and documents from the indexes of
shared/job_index.py (a range of a sorted set, then one pipelined read of those rows), never
every job. A filtered page reads the index in chunks until its rows are full or it has read
COSYQ_UI_SCAN_LIMIT entries; the next page starts where it stopped."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis
from rq.job import Job

from shared import keys
from shared.document_state import document_key
from shared.job_index import page_ids, summaries
from shared.tenants import TENANT_META_KEY

STATES = ("queued", "started", "finished", "failed", "canceled", "stopped", "scheduled", "deferred")
VERDICTS = ("ok", "suspect", "judged")


@dataclass(frozen=True)
class JobFilter:
    """What the list shows: every field optional; `tenant` is forced for a tenant key."""

    state: str = ""
    verdict: str = ""
    tenant: str = ""
    voice: str = ""
    since_h: float | None = None  # submitted within the last `since_h` hours

    def keeps(self, row: JobRow) -> bool:
        verdict_ok = (
            not self.verdict
            or (self.verdict == "judged" and row.judgement is not None)
            or row.verdict == self.verdict
        )
        return (
            (not self.state or row.state == self.state)
            and verdict_ok
            and (not self.voice or row.voice == self.voice)
        )


@dataclass(frozen=True)
class JobRow:
    job_id: str
    submitted_at: float
    state: str
    tenant: str | None
    voice: str
    verdict: str | None
    audio_s: float | None
    judgement: str | None


T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    rows: list[T]
    next_offset: int | None  # None: the index has no more
    scanned: int


def job_page(
    connection: redis.Redis,
    tenant: str | None,
    wanted: JobFilter,
    *,
    offset: int,
    size: int,
    scan_limit: int,
) -> Page[JobRow]:
    """Up to `size` rows from `offset` in the index of `tenant` (None: every tenant's)."""
    since = None if wanted.since_h is None else time.time() - wanted.since_h * 3600
    rows: list[JobRow] = []
    scanned, chunk = 0, max(size, 50)
    while len(rows) < size and scanned < scan_limit:
        ids = page_ids(
            connection, keys.JOB_INDEX, tenant, offset=offset + scanned, count=chunk, since=since
        )
        if not ids:
            return Page(rows, None, scanned)
        for index, row in enumerate(job_rows(connection, ids)):
            if row is not None and wanted.keeps(row):
                rows.append(row)
                if len(rows) == size:
                    return Page(rows, offset + scanned + index + 1, scanned + index + 1)
        scanned += len(ids)
    return Page(rows, offset + scanned, scanned)


def job_rows(connection: redis.Redis, ids: Sequence[tuple[str, float]]) -> list[JobRow | None]:
    """One pipelined read of each job's hash fields, its summary and its judgement (None: the
    job is gone from Redis)."""
    with connection.pipeline(transaction=False) as pipe:
        for job_id, _ in ids:
            pipe.hmget(Job.key_for(job_id), ["status", "meta"])
        for job_id, _ in ids:
            pipe.get(keys.JUDGEMENT_PREFIX + job_id)
        replies: list[Any] = pipe.execute()
    fields, judged = replies[: len(ids)], replies[len(ids) :]
    found = summaries(connection, [job_id for job_id, _ in ids])
    rows: list[JobRow | None] = []
    for (job_id, at), (status, meta), summary, judgement in zip(
        ids, fields, found, judged, strict=True
    ):
        row = None if status is None else _row(job_id, at, status, meta, summary, judged=judgement)
        rows.append(row)
    return rows


def _row(
    job_id: str,
    at: float,
    status: bytes,
    meta: bytes | None,
    summary: dict[str, Any],
    *,
    judged: Any,
) -> JobRow:
    parsed = _json(meta)
    submitted = parsed.get(keys.SUBMIT_META_KEY)
    voice = submitted.get("voice") if isinstance(submitted, dict) else None
    tenant = parsed.get(TENANT_META_KEY)
    audio_s = summary.get("audio_s")
    return JobRow(
        job_id=job_id,
        submitted_at=at,
        state=status.decode(),
        tenant=tenant if isinstance(tenant, str) else None,
        voice=voice if isinstance(voice, str) else "",
        verdict=summary.get("verdict") if isinstance(summary.get("verdict"), str) else None,
        audio_s=float(audio_s) if isinstance(audio_s, int | float) else None,
        judgement=_json(judged).get("action") if judged is not None else None,
    )


def _json(raw: bytes | str | None) -> dict[str, Any]:
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class DocumentRow:
    document_id: str
    submitted_at: float
    tenant: str | None
    segments: int
    assembled: bool


def document_page(
    connection: redis.Redis, tenant: str | None, *, offset: int, size: int
) -> Page[DocumentRow]:
    ids = page_ids(connection, keys.DOCUMENT_INDEX, tenant, offset=offset, count=size)
    with connection.pipeline(transaction=False) as pipe:
        for document_id, _ in ids:
            pipe.get(document_key(document_id))
            pipe.exists(document_key(document_id, "result"))
        replies: list[Any] = pipe.execute()
    rows = []
    for position, (document_id, at) in enumerate(ids):
        plan, assembled = _json(replies[2 * position]), bool(replies[2 * position + 1])
        if not plan:
            continue  # expired
        segments = plan.get("segments")
        owner = plan.get("tenant")
        rows.append(
            DocumentRow(
                document_id=document_id,
                submitted_at=at,
                tenant=owner if isinstance(owner, str) else None,
                segments=len(segments) if isinstance(segments, list) else 0,
                assembled=assembled,
            )
        )
    more = len(ids) == size
    return Page(rows, offset + size if more else None, len(ids))
