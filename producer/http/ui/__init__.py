"""The operator's page at /ui (issue 49): the fleet, jobs and documents, and judging suspect
results, rendered on the server from the same data the API reads (no build step, nothing
fetched from elsewhere: the one script and stylesheet are in static/).

`install_ui(app)` adds its routes (none of them in /openapi.json) and its static files.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from producer.http.ui import access, document_pages, pages
from producer.http.ui.access import SignInNeeded, sign_in_redirect
from producer.http.ui.render import STATIC


def install_ui(app: FastAPI) -> None:
    app.include_router(access.router)
    app.include_router(pages.router)
    app.include_router(document_pages.router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")
    app.add_exception_handler(SignInNeeded, sign_in_redirect)
