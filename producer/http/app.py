"""The ASGI application of `cosyq serve`: routes, key check, error JSON, size cap, access log.

`create_app(settings)` builds it (tests pass their own settings); `app_from_environment` is the
factory uvicorn imports in each worker process, reading COSYQ_* like every entry point.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI

from producer.client import CosyqClient
from producer.http import documents, health, jobs, metrics, speech, voices
from producer.http.auth import KeyCheck
from producer.http.context import FrontContext
from producer.http.errors import install_error_handlers
from producer.http.middleware import AccessLog, BodyLimit
from shared.logs import configure_logging
from shared.settings import Settings, load_settings

if TYPE_CHECKING:
    from producer.webhooks.background import BackgroundDispatcher


def create_app(settings: Settings, *, client: CosyqClient | None = None) -> FastAPI:
    """The HTTP front on `settings` (one CosyqClient per process, made at start-up)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        context = FrontContext.create(settings, client)
        app.state.cosyq = context
        webhooks = _webhook_dispatcher(settings)
        try:
            yield
        finally:
            if webhooks is not None:
                webhooks.close()
            await context.close()

    app = FastAPI(
        title="cosyq",
        summary="CosyVoice 2 speech over the cosyq queue (OpenAI-compatible /v1/audio/speech)",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    check_key = Depends(KeyCheck(settings.api_key_entries()))
    app.include_router(health.router)
    app.include_router(metrics.router)  # no key, like /healthz: Prometheus scrapes it
    for router in (speech.router, voices.router, jobs.router, documents.router):
        app.include_router(router, dependencies=[check_key])
    install_error_handlers(app, settings.http_retry_after_s)
    app.add_middleware(
        BodyLimit,
        max_body_bytes=settings.http_max_body_bytes,
        max_upload_bytes=settings.http_max_upload_bytes,
    )
    app.add_middleware(AccessLog)
    return app


def _webhook_dispatcher(settings: Settings) -> BackgroundDispatcher | None:
    """COSYQ_WEBHOOK_DISPATCH_IN_SERVE: this server process also delivers webhooks."""
    if not settings.webhook_dispatch_in_serve:
        return None
    from producer.webhooks.background import BackgroundDispatcher  # noqa: PLC0415

    return BackgroundDispatcher(settings).start()


def app_from_environment() -> FastAPI:
    """uvicorn's factory (`--factory producer.http.app:app_from_environment`)."""
    settings = load_settings()
    configure_logging(settings)
    return create_app(settings)
