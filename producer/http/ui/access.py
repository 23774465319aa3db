"""Who may see the page: sign-in and sign-out, and the dependency every /ui route runs first.

A request with `Authorization: Bearer <key>` is that key's caller (a wrong key: 401, as the
API answers). Otherwise the session cookie (producer/http/ui/session.py) names the caller; no
valid session sends a browser to the sign-in form; a session is valid while the key that opened
it is still configured for the same tenant and rights (revoking or moving a key ends its
sessions). Without any key configured (loopback only)
everyone is tenant "default", as for the API. A POST from another origin is refused (403),
and a cookie caller's POST must carry its session's CSRF token.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

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


def check_post(request: Request, caller: Caller, csrf: str | None) -> None:
    """A state-changing form: same origin, and the session's token for a cookie caller."""
    origin = request.headers.get("origin")
    if origin and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise ApiError(403, "a /ui form posted from another origin", code="bad_origin")
    if not csrf_ok(caller, csrf):
        raise ApiError(403, "the form's session token is missing or stale", code="bad_csrf")


UiCaller = Annotated[Caller, Depends(caller_of)]


@router.get(SIGN_IN)
async def sign_in_form(request: Request) -> Response:
    return render(request, "signin.html", caller=None, error=None)


@router.post(SIGN_IN)
async def sign_in(
    request: Request, key: Annotated[str, Form()], name: Annotated[str, Form()] = ""
) -> Response:
    """The key, checked in constant time, opens a session; the cookie holds only its id. A
    wrong one counts against the client's address as a wrong API key does (auth.py)."""
    context, key_check = _front(request)
    origin = request.headers.get("origin")
    if origin and urlsplit(origin).netloc != request.headers.get("host", ""):
        raise ApiError(403, "a /ui form posted from another origin", code="bad_origin")
    found = (
        await run_in_threadpool(key_check.checked_key, request, key.strip())  # 429 past the limit
        if key_check.enabled
        else None
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
        key_digest=key_digest(key.strip()),
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
async def sign_out(
    request: Request, caller: UiCaller, csrf: Annotated[str, Form()] = ""
) -> Response:
    check_post(request, caller, csrf)
    await run_in_threadpool(
        close_session, context_of(request).connection, request.cookies.get(COOKIE, "")
    )
    response = RedirectResponse(SIGN_IN, status_code=303)
    response.delete_cookie(COOKIE, path="/ui", secure=True, httponly=True, samesite="strict")
    return response


def sign_in_redirect(request: Request, error: Exception) -> Response:
    """The exception handler for SignInNeeded."""
    return RedirectResponse(SIGN_IN, status_code=303)
