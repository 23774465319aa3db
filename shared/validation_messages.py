"""The one phrasing of a validation error: pydantic's errors as "field: rule; field: rule".

The producer, the worker and the HTTP front all answer bad input with these words, so a field's
problem reads the same wherever it is caught; input text is never repeated in a message, nor
a URL's password.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from shared.settings_env import redact_urls

SHOWN_ERRORS = 5  # a message names the first few problems, then how many more
SHOWN_LOC_PARTS = 6
NEVER_ECHOED = frozenset({"text", "prompt_text", "instruction"})  # never repeat input text


def describe_errors(errors: Sequence[Any], never_echoed: frozenset[str] = NEVER_ECHOED) -> str:
    """Pydantic errors as "field: rule; field: rule" (the first few, then how many more): the
    one phrasing of every validation error, the producer's and the HTTP front's alike."""
    shown = [describe_error(error, never_echoed) for error in errors[:SHOWN_ERRORS]]
    if len(errors) > SHOWN_ERRORS:
        shown.append(f"and {len(errors) - SHOWN_ERRORS} more")
    return "; ".join(shown)


def unknown_fields(data: Mapping[Any, Any], model: type[BaseModel]) -> str | None:
    """ "a: unknown field; ...; and N more" when `data` names more fields that `model` lacks than
    a message shows; None otherwise (pydantic's own errors say it, beside any other). Checked
    before pydantic, which would first build an error of each in one call holding the GIL: a
    body of 32,000 unknown keys took ~95 ms there, the front's event loop waiting for it."""
    known = model.model_fields  # a property: read once
    unknown = [key for key in data if key not in known]
    if len(unknown) <= SHOWN_ERRORS:
        return None
    shown = [f"{key}: unknown field" for key in unknown[:SHOWN_ERRORS]]
    return "; ".join([*shown, f"and {len(unknown) - SHOWN_ERRORS} more"])


def describe_error(error: Any, never_echoed: frozenset[str] = NEVER_ECHOED) -> str:
    """One pydantic error as "field: rule" (a deep location cut, the input shown short)."""
    loc = [str(part) for part in error["loc"]]
    field = ".".join(loc if len(loc) <= SHOWN_LOC_PARTS else [*loc[:SHOWN_LOC_PARTS], "..."])
    if error["type"] == "cosyq_rule":
        return f"{field}: {error['msg']}" if field else error["msg"]
    if error["type"] == "extra_forbidden":
        return f"{field}: unknown field"
    if error["type"] == "missing":
        return f"{field}: required"
    if field in never_echoed:
        return f"{field}: {error['msg'].lower()}"
    given = error.get("input")
    given = redact_urls(given) if isinstance(given, str) else given  # a URL's password: ***
    got = reprlib.repr(given)  # bounded in depth and length, unlike repr
    shown = got if len(got) <= 40 else got[:37] + "..."
    return f"{field or 'request'}: {error['msg'].lower()} (got {shown})"
