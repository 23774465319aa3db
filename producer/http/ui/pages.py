"""The /ui pages: fleet, jobs (list, one job, its audio and pictures, judging), documents.

Every route runs `caller_of` first (bearer key or session) and reads through the same
`FrontContext` rules as the API: a tenant key reaches its own jobs and documents only (another
tenant's answer as not found), an operator key every tenant's. Nothing here is in /openapi.json.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from producer.http.context import Context
from producer.http.jobs import checked_job_id, owned_job
from producer.http.storage_read import audio_response, check_owned, job_not_found
from producer.http.ui import fleet as fleet_data
from producer.http.ui import listing
from producer.http.ui.access import UiCaller, field, posted_form
from producer.http.ui.judging import JobView, job_view, judge, next_suspect
from producer.http.ui.pictures import decode, spectrogram_png, waveform_png
from producer.http.ui.render import SECURITY_HEADERS, render
from producer.http.ui.session import Caller
from producer.tracking import job_status

router = APIRouter(include_in_schema=False)


def _scope(caller: Caller) -> str | None:
    """Whose index a list reads: every tenant's for an operator, else the caller's own."""
    return None if caller.operator else caller.tenant


@router.get("/ui")
async def fleet_page(request: Request, caller: UiCaller, context: Context) -> Response:
    data = await run_in_threadpool(
        fleet_data.fleet, context.connection, context.settings, _scope(caller)
    )
    return render(request, "fleet.html", caller=caller, fleet=data, chart=fleet_data)


@router.get("/ui/jobs")
async def jobs_page(
    request: Request,
    *,
    caller: UiCaller,
    context: Context,
    state: str = "",
    verdict: str = "",
    tenant: str = "",
    voice: str = "",
    since_h: str = "",
    offset: int = 0,
) -> Response:
    wanted = listing.JobFilter(state, verdict, tenant, voice.strip(), _hours(since_h))
    scope = _scope(caller) if not (caller.operator and tenant) else tenant
    page = await run_in_threadpool(
        listing.job_page,
        context.connection,
        scope,
        wanted,
        offset=max(0, offset),
        size=context.settings.ui_page_size,
        scan_limit=context.settings.ui_scan_limit,
    )
    return render(
        request,
        "jobs.html",
        caller=caller,
        page=page,
        wanted=wanted,
        states=listing.STATES,
        verdicts=listing.VERDICTS,
    )


def _hours(raw: str) -> float | None:
    """The list's "last hours" box: a positive number, else no time filter."""
    try:
        hours = float(raw)
    except ValueError:
        return None
    return hours if 0 < hours < 1e6 else None


async def _job(request: Request, context: Context, job_id: str) -> JobView:
    job = await owned_job(request, context, job_id)  # another tenant's: no such job
    status = await run_in_threadpool(job_status, job)
    return await run_in_threadpool(job_view, context.client, job, status)


@router.get("/ui/jobs/{job_id}")
async def job_page(
    request: Request, caller: UiCaller, context: Context, job_id: str, queue: int = 0
) -> Response:
    view = await _job(request, context, job_id)
    return render(request, "job.html", caller=caller, view=view, queue=bool(queue))


@router.get("/ui/jobs/{job_id}/audio")
async def job_audio(request: Request, caller: UiCaller, context: Context, job_id: str) -> Response:
    view = await _job(request, context, job_id)
    if view.status.result is None:
        return Response("no audio", status_code=404, media_type="text/plain")
    return await audio_response(context, view.status.result, view.status.tenant)


@router.get("/ui/jobs/{job_id}/{picture}.png")
async def job_picture(
    request: Request, caller: UiCaller, context: Context, job_id: str, picture: str
) -> Response:
    if picture not in ("waveform", "spectrogram"):
        return Response("no such picture", status_code=404, media_type="text/plain")
    view = await _job(request, context, job_id)
    result = view.status.result
    if result is None:
        return Response("no audio", status_code=404, media_type="text/plain")
    check_owned(context, result.uri, view.status.tenant, job_not_found(job_id))
    data = await run_in_threadpool(context.storage.get, result.uri)
    samples, rate = await run_in_threadpool(decode, data)
    if picture == "waveform":
        image = await run_in_threadpool(waveform_png, samples)
    else:
        image = await run_in_threadpool(spectrogram_png, samples, rate)
    return Response(image, media_type="image/png", headers=SECURITY_HEADERS)


@router.post("/ui/jobs/{job_id}/judge")
async def judge_job(
    request: Request,
    *,
    caller: UiCaller,
    context: Context,
    job_id: str,
) -> Response:
    request.state.job_id = checked_job_id(job_id)
    form = await posted_form(request, caller)  # read only now: the caller is judged
    action, queue = field(form, "action"), field(form, "queue") not in ("", "0")
    view = await _job(request, context, job_id)
    job = await run_in_threadpool(context.client.tracker.fetch, job_id)
    await run_in_threadpool(judge, context.client, job, view, action, caller.who)
    if queue:
        following = await run_in_threadpool(next_suspect, context.client, _scope(caller), job_id)
        if following is not None:
            return RedirectResponse(f"/ui/jobs/{following}?queue=1", status_code=303)
        return RedirectResponse("/ui/suspects", status_code=303)
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


@router.get("/ui/suspects")
async def suspects(request: Request, caller: UiCaller, context: Context) -> Response:
    """The judging queue: the oldest suspect waiting, or a page saying there is none."""
    first = await run_in_threadpool(next_suspect, context.client, _scope(caller))
    if first is not None:
        return RedirectResponse(f"/ui/jobs/{first}?queue=1", status_code=303)
    return render(request, "suspects.html", caller=caller)
