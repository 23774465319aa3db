"""The /ui documents: the list, a document's page (segments, each playable, its captions, its
state) and its retry and cancel buttons (as POST /v1/documents/{id}:retry and DELETE do)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from producer.documents import DocumentStatus
from producer.http.context import Context
from producer.http.documents import check_document_owner
from producer.http.storage_read import check_owned, document_not_found, stored_response
from producer.http.ui import listing
from producer.http.ui.access import UiCaller, posted_form
from producer.http.ui.render import render
from shared.audio import CONTENT_TYPES
from shared.document_state import DocumentPlanRecord, document_key, load_plan
from shared.errors import ObjectNotFoundError, StorageError

router = APIRouter(include_in_schema=False)


@dataclass(frozen=True)
class SegmentView:
    index: int
    text: str
    job_id: str | None
    verdict: str | None
    failure: str | None
    span: tuple[float, float] | None  # where it lies in the assembled file (seconds)


@router.get("/ui/documents")
async def documents_page(
    request: Request, caller: UiCaller, context: Context, offset: int = 0
) -> Response:
    scope = None if caller.operator else caller.tenant
    page = await run_in_threadpool(
        listing.document_page,
        context.connection,
        scope,
        offset=max(0, offset),
        size=context.settings.ui_page_size,
    )
    return render(request, "documents.html", caller=caller, page=page)


def _segments(
    context: Context, plan: DocumentPlanRecord, status: DocumentStatus
) -> list[SegmentView]:
    spans = _spans(context, status, plan.tenant)
    raw: Any = context.connection.hgetall(document_key(plan.document_id, "jobs"))
    jobs = {int(k): v.decode() for k, v in raw.items()}
    failures = {f.index: f.reason for f in status.failures}
    verdicts = status.verdicts
    return [
        SegmentView(
            index=segment.index,
            text=segment.plain,
            job_id=jobs.get(segment.index),
            verdict=verdicts[segment.index] if segment.index < len(verdicts) else None,
            failure=failures.get(segment.index),
            span=spans.get(segment.index),
        )
        for segment in plan.segments
    ]


def _spans(
    context: Context, status: DocumentStatus, owner: str | None
) -> dict[int, tuple[float, float]]:
    """Each segment's (start, end) in the assembled file, from its manifest ({} before
    assembly: each segment then plays from its own job's audio)."""
    if status.result is None:
        return {}
    uri = status.result.manifest_uri
    check_owned(context, uri, owner, document_not_found(status.document_id))
    try:
        manifest = json.loads(context.storage.get(uri))
        return {
            int(s["index"]): (float(s["start_s"]), float(s["end_s"]))
            for s in manifest.get("segments", [])
        }
    except (ObjectNotFoundError, StorageError, ValueError, KeyError, TypeError):
        return {}


def _captions(context: Context, status: DocumentStatus, owner: str | None) -> str:
    """The assembled document's WebVTT captions ("" before assembly or when unreadable)."""
    if status.result is None:
        return ""
    uri = status.result.vtt_uri
    check_owned(context, uri, owner, document_not_found(status.document_id))
    try:
        return context.storage.get(uri).decode("utf-8", "replace")
    except (ObjectNotFoundError, StorageError):
        return ""


@router.get("/ui/documents/{document_id}")
async def document_page(
    request: Request, caller: UiCaller, context: Context, document_id: str
) -> Response:
    await check_document_owner(context, document_id)  # 404: none, or another tenant's
    plan = await run_in_threadpool(load_plan, context.connection, document_id)
    status = await run_in_threadpool(context.client.document_status, document_id)
    segments = await run_in_threadpool(_segments, context, plan, status)
    captions = await run_in_threadpool(_captions, context, status, plan.tenant)
    return render(
        request,
        "document.html",
        caller=caller,
        plan=plan,
        status=status,
        segments=segments,
        captions=captions,
    )


@router.get("/ui/documents/{document_id}/audio")
async def document_audio(caller: UiCaller, context: Context, document_id: str) -> Response:
    owner = await check_document_owner(context, document_id)
    status = await run_in_threadpool(context.client.document_status, document_id)
    if status.result is None:
        return Response("not assembled", status_code=404, media_type="text/plain")
    media = CONTENT_TYPES[status.result.format]
    return await stored_response(context, status.result.uri, media, {}, document_id, owner=owner)


@router.post("/ui/documents/{document_id}/{action}")
async def change_document(
    request: Request,
    *,
    caller: UiCaller,
    context: Context,
    document_id: str,
    action: str,
) -> Response:
    """retry: run again what failed or was lost; cancel: stop the segments not done yet."""
    await posted_form(request, caller)  # read only now: the caller is judged
    if action not in ("retry", "cancel"):
        return Response("no such action", status_code=404, media_type="text/plain")
    # retry runs in the document's own tenant (an operator may); cancel is the owner's alone
    await check_document_owner(context, document_id, change=action == "cancel")
    if action == "retry":
        await run_in_threadpool(context.client.retry_document, document_id)
    else:
        await run_in_threadpool(context.client.cancel_document, document_id)
    return RedirectResponse(f"/ui/documents/{document_id}", status_code=303)
