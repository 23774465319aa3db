"""Pages rendered from the templates beside this module (Jinja2, autoescaped), with headers that
keep them to themselves: no framing, scripts and styles from /ui/static only, nothing cached."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader, select_autoescape

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "media-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
        "base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",  # a form's POST then carries its Origin
    "Cache-Control": "no-store",
}


def _when(stamp: float | str | None) -> str:
    """A Unix time or an ISO string as `YYYY-MM-DD HH:MM:SS` UTC ("" when unknown)."""
    if stamp in (None, ""):
        return ""
    try:
        moment = (
            datetime.fromtimestamp(float(stamp), UTC)
            if isinstance(stamp, int | float)
            else datetime.fromisoformat(str(stamp))
        )
    except ValueError:
        return str(stamp)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


ENVIRONMENT = Environment(
    loader=FileSystemLoader(HERE / "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
ENVIRONMENT.filters["when"] = _when
ENVIRONMENT.filters["seconds"] = _seconds


def render(
    request: Request, template: str, *, status_code: int = 200, **values: Any
) -> HTMLResponse:
    """`template` with `values` (and `path`, the page's own path, for the navigation)."""
    page = ENVIRONMENT.get_template(template).render(path=request.url.path, **values)
    return HTMLResponse(page, status_code=status_code, headers=SECURITY_HEADERS)
