"""How a refused `Settings` reads: one line naming each variable and rule, never a secret; and
how a good one reads in repr() and str() (`MaskedRepr`): secret fields masked, URLs masked.

A pydantic error carries the `input` it refused; for a rule over several fields (a model
validator) that input is every setting at once, the Redis password, S3 keys, API keys and
webhook secret among them. So an input is shown only where it is one field's own value and
that field is not secret; a secret field is any `SecretStr` or one marked
`json_schema_extra={"secret": True}`. Every URL in a message or an input (the Redis URL, the
storage URL, a prompt root) is shown with its password and query credentials masked.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Iterator, Mapping
from typing import Any

from pydantic import BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo

from shared.settings_env import ENV_PREFIX, redact_url, redact_urls

SHOWN_INPUT_CHARS = 80  # a longer refused value is cut, so one line stays one line
# One URL each: masked as a whole (a raw space or comma in a password ends no URL here)
URL_FIELDS = frozenset({"redis_url", "storage_url", "s3_endpoint_url"})
# Comma-separated URLs: masked one by one (a URL whose scheme was forgotten is found by no
# pattern, and its user:password@ would be shown)
URL_LIST_FIELDS = frozenset({"prompt_roots", "webhook_allowed_urls"})


def is_secret(field: FieldInfo) -> bool:
    """A SecretStr field (alone or optional), or one marked secret in json_schema_extra."""
    extra = field.json_schema_extra
    if isinstance(extra, Mapping) and extra.get("secret"):
        return True
    annotation = field.annotation
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


class MaskedRepr(BaseModel):
    """A mixin: repr() and str() show a secret field as a SecretStr does ('**********') and every
    URL with its credentials masked, so a Settings in a log line or a traceback leaks nothing."""

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        fields = type(self).model_fields
        for name, value in super().__repr_args__():
            field = fields.get(name) if name is not None else None
            if field is not None and is_secret(field) and value is not None:
                yield name, value if isinstance(value, SecretStr) else SecretStr("hidden")
            else:
                yield name, masked(name or "", value) if isinstance(value, str) else value


def describe(error: ValidationError, fields: Mapping[str, FieldInfo]) -> str:
    """`invalid settings: COSYQ_X: why (got 'v'); settings: why` with no secret in it."""
    problems = [_problem(item, fields) for item in error.errors(include_input=True)]
    return "invalid settings: " + "; ".join(problems)


def describe_unparsed(error: Exception) -> str:
    """`invalid settings: COSYQ_X: not valid JSON` for a JSON setting pydantic-settings could not
    parse: its own message names the field and the "EnvSettingsSource", not the variable."""
    named = re.search(r'field "(\w+)"', str(error))
    if named is None:
        return f"invalid settings: {error}"
    return (
        f"invalid settings: {ENV_PREFIX}{named.group(1).upper()}: not valid JSON"
        " (unset it for none, or give a JSON object: see README)"
    )


def _problem(item: Any, fields: Mapping[str, FieldInfo]) -> str:
    loc = item["loc"]
    field = str(loc[0]) if len(loc) == 1 else None
    message = redact_urls(item["msg"])  # a rule's message may quote a URL it refused
    if loc and str(loc[0]) in fields and len(loc) > 1:  # inside one setting (JSON): its name
        inside = ".".join(str(part) for part in loc[1:])
        return f"{ENV_PREFIX}{str(loc[0]).upper()}: {inside}: {message}"
    if field is None or field not in fields:  # a rule over several settings: no input shown
        where = ".".join(str(part) for part in loc) or "settings"
        return f"{where}: {message}"
    shown = _shown_input(field, fields[field], item.get("input"))
    return f"{ENV_PREFIX}{field.upper()}: {message}{shown}"


def masked(name: str, text: str) -> str:
    """A setting's text with its URLs' credentials masked: a URL field's value as one URL."""
    if name in URL_LIST_FIELDS:
        return ",".join(redact_url(part) for part in text.split(","))
    return redact_url(text) if name in URL_FIELDS else redact_urls(text)


def _shown_input(name: str, field: FieldInfo, given: Any) -> str:
    if is_secret(field):
        return ""  # not even its length
    if isinstance(given, str):
        given = masked(name, given)  # any URL's password and query credentials masked
    elif not isinstance(given, int | float | bool | None):
        return ""  # a structure may hold anything
    text = repr(given)
    if len(text) > SHOWN_INPUT_CHARS:
        text = text[: SHOWN_INPUT_CHARS - 3] + "..."
    return f" (got {text})"
