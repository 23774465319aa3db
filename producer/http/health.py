"""GET /healthz (the process answers) and GET /readyz (it can do useful work); no key needed.

Ready means: Redis answers PING, the storage can be read (`probe_storage` in read mode: the
front reads results from it), and at least one worker has loaded its model (its published
stats say idle or busy). A load balancer sends traffic only where /readyz is 200; the 503 body
says which check failed, in the same error JSON as every other error, naming no URL's user
name or password (it answers anyone).
"""

from __future__ import annotations

import redis
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from producer.http.context import FrontContext, context_of
from producer.http.errors import SERVER_ERROR, ApiError
from shared import keys
from shared.settings_env import redact_urls
from shared.storage_probe import probe_storage

router = APIRouter()

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
        raise ApiError(
            503,
            _public(f"not ready: Redis at {context.settings.redis_url}: {e}"),
            type_=SERVER_ERROR,
            code="redis_unreachable",
        ) from e
    storage = await run_in_threadpool(probe_storage, context.storage, mode="read")
    if not storage.ok:
        raise ApiError(
            503, _public(f"not ready: {storage.line}"), type_=SERVER_ERROR, code="storage_unusable"
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
