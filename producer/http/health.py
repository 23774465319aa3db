"""GET /healthz (the process answers) and GET /readyz (it can do useful work); no key needed.

Ready means: Redis answers PING, the storage can be read (`probe_storage` in read mode: the
front reads results from it), and at least one worker has loaded its model (its published
stats say idle or busy). A load balancer sends traffic only where /readyz is 200; the 503 body
says which check failed (`code`), in the same error JSON as every other error. Why it failed
(the Redis or storage address, a bucket, the error) is deployment detail: it is in the body
only for an operator key, or on a front without keys (loopback only), never for an anonymous
or tenant caller, and always in the log line `readyz_not_ready`; either way no URL's user name
or password. A wrong key is a 401, as for /metrics.
"""

from __future__ import annotations

import redis
import structlog
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from producer.http.auth import KeyCheck
from producer.http.context import FrontContext, context_of
from producer.http.errors import SERVER_ERROR, ApiError
from shared import keys
from shared.first_contact import silent_close_hint
from shared.settings_env import redact_urls
from shared.storage_probe import probe_storage

router = APIRouter()
log = structlog.get_logger("cosyq.http")

READY_WORKER_STATES = frozenset({b"idle", b"busy"})
SCAN_COUNT = 500


async def ready_workers(context: FrontContext) -> int:
    count = 0
    async for key in context.aredis.scan_iter(
        match=keys.WORKER_STATS_PREFIX + "*", count=SCAN_COUNT
    ):
        if await context.aredis.hget(key, "state") in READY_WORKER_STATES:
            count += 1
    return count


def _public(message: str) -> str:
    """An answer to anyone (no key): every URL in it without its user name or password."""
    return redact_urls(message, keep_user=False)


def shows_detail(request: Request) -> bool:
    """Whether this caller sees why the front is not ready: an operator key, or anyone on a
    front without keys; 401 for a wrong key (counted, as everywhere)."""
    check: KeyCheck = request.app.state.key_check
    if not check.enabled:
        return True
    if "authorization" not in request.headers:
        return False
    return check.caller_of(request)[1]


def not_ready(request: Request, code: str, summary: str, detail: str) -> ApiError:
    """The 503 for a failed check: `summary` for everyone, `detail` logged (and shown to
    an operator) with every URL's credentials masked."""
    detail = _public(detail)
    log.warning("readyz_not_ready", code=code, detail=detail)
    try:
        shown = shows_detail(request)
    except (ApiError, redis.RedisError) as e:
        if isinstance(e, ApiError) and e.status < 500:
            raise  # a wrong key: 401 (or 429 past the wrong keys' limit)
        shown = False  # Redis is down: the key cannot be judged
    message = f"not ready: {detail}" if shown else f"not ready: {summary}"
    return ApiError(503, message, type_=SERVER_ERROR, code=code)


@router.get("/healthz")
async def healthz() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    context = context_of(request)
    try:
        await context.aredis.ping()
        workers = await ready_workers(context)
    except redis.RedisError as e:
        hint = silent_close_hint(e)  # started with Redis away, and now a service on its port?
        raise await _not_ready(
            request,
            "redis_unreachable",
            "Redis is unreachable",
            f"Redis at {context.settings.redis_url}: {e}" + (f" ({hint})" if hint else ""),
        ) from e
    storage = await run_in_threadpool(probe_storage, context.storage, mode="read")
    if not storage.ok:
        raise await _not_ready(
            request, "storage_unusable", "the storage cannot be read", storage.line
        )
    if workers == 0:
        raise ApiError(
            503,
            "not ready: no worker has loaded its model (cosyq-worker pool)",
            type_=SERVER_ERROR,
            code="no_ready_worker",
        )
    return JSONResponse(
        {"status": "ready", "redis": "ok", "storage": "ok", "ready_workers": workers}
    )


async def _not_ready(request: Request, code: str, summary: str, detail: str) -> ApiError:
    """`not_ready` off the event loop (a key check may count a wrong key in Redis)."""
    return await run_in_threadpool(not_ready, request, code, summary, detail)
