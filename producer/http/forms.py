"""Multipart forms read strictly: a text field that is not valid in its charset is a 400.

Starlette decodes a form's text fields with the part's charset (UTF-8 unless the request says
otherwise) and, when the bytes do not decode, falls back to Latin-1: a transcript in a broken
encoding would be accepted as mojibake. `read_form` decodes every text field strictly and
answers 400 naming the field instead.
"""

from __future__ import annotations

from contextlib import aclosing

from fastapi import Request
from starlette.datastructures import FormData
from starlette.formparsers import MultiPartException, MultiPartParser

from producer.http.errors import ApiError


class _TextDecodeError(Exception):
    def __init__(self, field: str, charset: str) -> None:
        super().__init__(field)
        self.field = field
        self.charset = charset


class StrictMultiPartParser(MultiPartParser):
    """Starlette's parser, whose text fields must decode in their charset."""

    def on_part_end(self) -> None:
        part = self._current_part
        if part.file is None:
            charset = self._charset or "utf-8"
            try:
                bytes(part.data).decode(charset)
            except (UnicodeDecodeError, LookupError):
                raise _TextDecodeError(part.field_name, charset) from None
        super().on_part_end()


async def read_form(request: Request, *, max_files: int, max_fields: int) -> FormData:
    """The request's multipart form, or a 400 for a text field that does not decode."""
    try:
        async with aclosing(request.stream()) as stream:
            parser = StrictMultiPartParser(
                request.headers, stream, max_files=max_files, max_fields=max_fields
            )
            return await parser.parse()
    except _TextDecodeError as e:
        raise ApiError(
            400,
            f"{e.field}: not valid {e.charset.upper()} text",
            param=e.field,
            code="invalid_value",
        ) from e
    except MultiPartException as e:
        raise ApiError(400, f"request: {e.message}", code="invalid_value") from e
