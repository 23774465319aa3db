"""Who may see the page: sign-in and sign-out, and the dependency every /ui route runs first.

A request with `Authorization: Bearer <key>` is that key's caller (a wrong key: 401, as the
API answers). Otherwise the session cookie (producer/http/ui/session.py) names the caller; no
valid session sends a browser to the sign-in form; a session is valid while the key that opened
it is still configured for the same tenant and rights (revoking or moving a key ends its
sessions). Without any key configured (loopback only)
everyone is tenant "default", as for the API. A POST from another origin is refused (403),
and a cookie caller's POST must carry its session's CSRF token. A form's body is read only
after its caller (and origin) is judged from the headers: a POST with no valid session is
answered (sign-in redirect, 401, 403) with its body unread.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData

from producer.http.auth import KeyCheck, key_digest
from producer.http.context import FrontContext, context_of
from producer.http.errors import ApiError
from producer.http.ui.render import render
from producer.http.ui.session import (
    COOKIE,
    Caller,
    clean_name,
    close_session,
    csrf_ok,
    open_session,
    read_session,
)
from shared.tenants import DEFAULT_TENANT

router = APIRouter(include_in_schema=False)
SIGN_IN = "/ui/signin"


class SignInNeeded(Exception):
    """No key and no valid session: the browser goes to the sign-in form."""


def _front(request: Request) -> tuple[FrontContext, KeyCheck]:
    context = request.app.state.cosyq
    key_check = request.app.state.key_check
    assert isinstance(context, FrontContext) and isinstance(key_check, KeyCheck)
    return context, key_check


def caller_of(request: Request) -> Caller:
    """The caller (bearer key, session, or loopback's default), bound to the request as the
    API's key check binds it: `context_of(request)` then reads as this tenant."""
    context, key_check = _front(request)
    if request.headers.get("authorization"):
        tenant, operator = key_check.caller_of(request)  # 401 for a wrong key
        caller = Caller(tenant, operator, "", None)
    elif not key_check.enabled:
        caller = Caller(DEFAULT_TENANT, False, "", None)
    else:
        found = read_session(context.connection, request.cookies.get(COOKIE, ""))
        # the key that opened it must still be configured, for the same tenant and rights
        if found is None or key_check.matching_digest(found.key_digest) != (
            found.tenant,
            found.operator,
        ):
            raise SignInNeeded
        caller = found
    request.state.tenant, request.state.operator = caller.tenant, caller.operator
    context.quota.hit(caller.tenant, operator=caller.operator)
    return caller


def check_origin(request: Request) -> None:
    """403 for a form posted from another origin (from the headers, the body unread)."""
    origin = request.headers.get("origin")
    if origin and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise ApiError(403, "a /ui form posted from another origin", code="bad_origin")


async def posted_form(request: Request, caller: Caller) -> FormData:
    """A state-changing form, read only now that its caller is judged (`caller_of`) and its
    origin is checked (the body capped at COSYQ_UI_MAX_FORM_BYTES); 403 without the
    session's token for a cookie caller."""
    check_origin(request)
    form = await request.form()
    if not csrf_ok(caller, field(form, "csrf")):
        raise ApiError(403, "the form's session token is missing or stale", code="bad_csrf")
    return form


def field(form: FormData, name: str) -> str:
    """A form's text field ("" when absent, or a file where text belongs)."""
    value = form.get(name)
    return value if isinstance(value, str) else ""


UiCaller = Annotated[Caller, Depends(caller_of)]


@router.get(SIGN_IN)
async def sign_in_form(request: Request) -> Response:
    return render(request, "signin.html", caller=None, error=None)


@router.post(SIGN_IN)
async def sign_in(request: Request) -> Response:
    """The key, checked in constant time, opens a session; the cookie holds only its id. A
    wrong one counts against the client's address as a wrong API key does (auth.py). The
    form is read only after its origin and address are judged (a locked-out address: 429)."""
    context, key_check = _front(request)
    check_origin(request)
    await run_in_threadpool(key_check.check_address, request)  # 429 past the limit
    form = await request.form()
    key, name = field(form, "key").strip(), field(form, "name")
    found = (
        await run_in_threadpool(key_check.checked_key, request, key)
        if key_check.enabled and key
        else None  # no key given: nothing to count
    )
    if found is None:
        return render(request, "signin.html", caller=None, error="unknown key", status_code=401)
    tenant, operator = found
    session_id = await run_in_threadpool(
        open_session,
        context.connection,
        tenant=tenant,
        operator=operator,
        name=clean_name(name),
        ttl_s=context.settings.ui_session_ttl_s,
        key_digest=key_digest(key),
    )
    response = RedirectResponse("/ui", status_code=303)
    response.set_cookie(
        COOKIE,
        session_id,
        max_age=context.settings.ui_session_ttl_s,
        path="/ui",
        httponly=True,
        secure=True,
        samesite="strict",
    )
    return response


@router.post("/ui/signout")
async def sign_out(request: Request, caller: UiCaller) -> Response:
    await posted_form(request, caller)
    await run_in_threadpool(
        close_session, context_of(request).connection, request.cookies.get(COOKIE, "")
    )
    response = RedirectResponse(SIGN_IN, status_code=303)
    response.delete_cookie(COOKIE, path="/ui", secure=True, httponly=True, samesite="strict")
    return response


def sign_in_redirect(request: Request, error: Exception) -> Response:
    """The exception handler for SignInNeeded."""
    return RedirectResponse(SIGN_IN, status_code=303)
