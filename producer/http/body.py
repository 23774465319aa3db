"""Reading a request body: JSON (an object, or for batches a list), or a 400 that says why; and
how a route documents the model its body is checked against.

The size cap is enforced before this (middleware.BodyLimit), so the whole body is in memory;
one holding more JSON items than COSYQ_HTTP_MAX_JSON_VALUES is refused before it is parsed
(json_items.py: parsing holds the event loop, for every tenant).
Bodies are read here rather than by FastAPI's own body parameters for two reasons: the job
contract is checked with the deployment's limits (`validate_request(body, limits)`, limits from
settings), which FastAPI cannot pass to a model's validators; and a body that is empty, not
JSON, not UTF-8 or nested too deeply gets the specific 400s below whatever its Content-Type.
So each route takes its typed model from a dependency (`Depends`) and declares the same model
as its OpenAPI request body with `json_body` (producer/http/openapi.py publishes the schemas).
"""

from __future__ import annotations

import json
import sys
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from producer.http.errors import ApiError, validation_failed
from producer.http.json_items import json_items_over
from shared.validation_messages import unknown_fields

Model = TypeVar("Model", bound=BaseModel)
SCHEMA_REF = "#/components/schemas/{model}"


async def read_json(request: Request) -> Any:
    raw = await request.body()
    if not raw.strip():
        raise ApiError(400, "request: the body is empty; send a JSON object", code="invalid_json")
    limit = request.app.state.cosyq.settings.http_max_json_values
    if json_items_over(raw, limit):  # refused unparsed: parsing it would hold the event loop
        raise ApiError(
            413,
            f"request body holds more than {limit:,} JSON values and keys "
            "(COSYQ_HTTP_MAX_JSON_VALUES)",
            code="body_too_large",
        )
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = (
            f" (line {e.lineno}, column {e.colno})" if isinstance(e, json.JSONDecodeError) else ""
        )
        raise ApiError(400, f"request: not valid JSON{where}", code="invalid_json") from e
    except ValueError as e:  # a number past Python's int-digits limit: the client's, not ours
        limit = sys.get_int_max_str_digits()
        raise ApiError(
            400, f"request: a JSON number has more than {limit:,} digits", code="invalid_json"
        ) from e
    except RecursionError as e:  # a hostile [[[[...]]]] is a bad request, not our failure
        raise ApiError(400, "request: JSON nested too deeply", code="invalid_json") from e


async def read_json_object(request: Request) -> dict[str, Any]:
    body = await read_json(request)
    if not isinstance(body, dict):
        raise ApiError(
            400, f"request: must be a JSON object (got {type(body).__name__})", code="invalid_json"
        )
    return body


def parse_body(model: type[Model], body: Any) -> Model:
    """`body` as `model`, or the 400 of errors.validation_failed (as for FastAPI's own)."""
    if isinstance(body, dict) and (unknown := unknown_fields(body, model)) is not None:
        raise ApiError(
            400,
            unknown,
            param=next(k for k in body if k not in model.model_fields),
            code="invalid_value",
        )
    try:
        return model.model_validate(body)
    except ValidationError as e:
        raise validation_failed(e.errors()) from e


def json_body(model: type[BaseModel], media_type: str = "application/json") -> dict[str, Any]:
    """A route's `openapi_extra`: its body is `model` (its examples are the model's)."""
    return {
        "requestBody": {
            "required": True,
            "content": {media_type: {"schema": {"$ref": SCHEMA_REF.format(model=model.__name__)}}},
        }
    }
