"""The ASGI application of `cosyq serve`: routes, key check, error JSON, size cap, access log,
and its OpenAPI schema at /openapi.json (no key needed, like /healthz).

`create_app(settings)` builds it (tests pass their own settings); `app_from_environment` is the
factory uvicorn imports in each worker process, reading COSYQ_* like every entry point.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata
from typing import TYPE_CHECKING

from fastapi import Depends, FastAPI

from producer.client import CosyqClient
from producer.http import documents, health, jobs, metrics, speech, voices
from producer.http.auth import KeyCheck
from producer.http.context import FrontContext
from producer.http.errors import install_error_handlers
from producer.http.jobs import BatchRequest
from producer.http.middleware import AccessLog, BodyLimit
from producer.http.openapi import install_openapi
from producer.http.responses import RESPONSE_MODELS
from producer.http.speech import SpeechRequest
from producer.http.ui import install_ui
from producer.http.voices import VoiceUpload
from shared.documents import DocumentRequest
from shared.jobs import SynthesisRequest
from shared.logs import configure_logging
from shared.settings import Settings, load_settings

if TYPE_CHECKING:
    from producer.webhooks.background import BackgroundDispatcher

OPEN_ROUTERS = (health.router, metrics.router)  # no key: probes; /metrics by key (scope_of)
KEYED_ROUTERS = (speech.router, voices.router, jobs.router, documents.router)
# The models the routes' bodies are checked against (each route names its own in openapi_extra).
REQUEST_MODELS = (SpeechRequest, SynthesisRequest, BatchRequest, DocumentRequest, VoiceUpload)


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
        version=_version(),
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    for router in OPEN_ROUTERS:
        app.include_router(router)
    key_check = KeyCheck(settings.api_key_entries(), operator_keys=settings.operator_key_list())
    app.state.key_check = key_check  # /metrics asks it who is scraping (a key is optional there)
    check_key = Depends(key_check)
    for router in KEYED_ROUTERS:
        app.include_router(router, dependencies=[check_key])
    install_ui(app)  # /ui: its own sign-in, the same keys (producer/http/ui/access.py)
    install_openapi(
        app, REQUEST_MODELS, response_models=RESPONSE_MODELS, keyed_routers=KEYED_ROUTERS
    )
    install_error_handlers(app, settings.http_retry_after_s)
    app.add_middleware(
        BodyLimit,
        max_body_bytes=settings.http_max_body_bytes,
        max_upload_bytes=settings.http_max_upload_bytes,
        max_form_bytes=settings.ui_max_form_bytes,
        keyed=key_check.knows_header if key_check.enabled else None,
    )
    app.add_middleware(AccessLog)
    return app


def _version() -> str:
    """The installed cosyq's version (pyproject.toml), in the OpenAPI schema's info."""
    try:
        return metadata.version("cosyq")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        return "0+unknown"


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
