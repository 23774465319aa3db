"""Reading a JSON request body: an object (or, for batches, a list), or a 400 that says why.

The size cap is enforced before this (middleware.BodyLimit), so the whole body is in memory.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from producer.http.errors import ApiError


async def read_json(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        raise ApiError(400, "request: the body is empty; send a JSON object", code="invalid_json")
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = (
            f" (line {e.lineno}, column {e.colno})" if isinstance(e, json.JSONDecodeError) else ""
        )
        raise ApiError(400, f"request: not valid JSON{where}", code="invalid_json") from e
    except RecursionError as e:  # a hostile [[[[...]]]] is a bad request, not our failure
        raise ApiError(400, "request: JSON nested too deeply", code="invalid_json") from e


async def read_json_object(request: Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ApiError(
            400, f"request: must be a JSON object (got {type(body).__name__})", code="invalid_json"
        )
    return body
