"""The OpenAPI schema at /openapi.json: FastAPI's, plus the request bodies and the key.

FastAPI documents responses and parameters itself. Request bodies are read by dependencies
(producer/http/body.py says why), and each route names its model in `openapi_extra`; here those
models' schemas (pydantic's own, in validation mode, so what is documented is what is checked)
join the components, and every keyed route is marked as needing `Authorization: Bearer`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.routing import BaseRoute

from producer.http.body import SCHEMA_REF

BEARER = "bearer"


def request_schemas(models: Iterable[type[BaseModel]]) -> dict[str, Any]:
    """The models' schemas and those they refer to, by component name."""
    _, schema = models_json_schema(
        [(model, "validation") for model in models], ref_template=SCHEMA_REF
    )
    return dict(schema.get("$defs", {}))


def install_openapi(
    app: FastAPI,
    request_models: Iterable[type[BaseModel]],
    *,
    response_models: Iterable[type[BaseModel]],
    keyed_routers: Iterable[APIRouter],
) -> None:
    """Make `app.openapi()` (served at /openapi.json) include `request_models`, the key on
    `keyed_routers`' routes, and our 400s in place of FastAPI's 422 (errors.validation_failed);
    `response_models` get their examples back whole (FastAPI drops the nulls in them)."""
    models = tuple(request_models)
    answers = tuple(response_models)
    keyed = [route for router in keyed_routers for route in router.routes]

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title,
                version=app.version,
                summary=app.summary,
                description=app.description,
                routes=app.routes,
            )
            components = schema.setdefault("components", {})
            _merge(components.setdefault("schemas", {}), request_schemas(models))
            _restore_examples(components["schemas"], answers)
            components["securitySchemes"] = {BEARER: {"type": "http", "scheme": "bearer"}}
            _mark_keyed(schema, keyed)
            _drop_unused_422(schema)
            _errors_as_json(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _restore_examples(schemas: dict[str, Any], models: Iterable[type[BaseModel]]) -> None:
    for model in models:
        examples = model.model_json_schema(mode="serialization").get("examples")
        if examples is not None and model.__name__ in schemas:
            schemas[model.__name__]["examples"] = examples


def _merge(schemas: dict[str, Any], extra: dict[str, Any]) -> None:
    """Add `extra`; a name FastAPI already uses for another schema is a bug, said at once."""
    for name, schema in extra.items():
        if name in schemas and schemas[name] != schema:
            raise RuntimeError(f"OpenAPI: two different schemas named {name}")
        schemas[name] = schema


def _mark_keyed(schema: dict[str, Any], routes: list[BaseRoute]) -> None:
    for route in routes:
        if not isinstance(route, APIRoute) or not route.include_in_schema:
            continue
        for method in route.methods or ():
            operation = schema["paths"][route.path_format].get(method.lower())
            if operation is not None:
                operation["security"] = [{BEARER: []}]


def _errors_as_json(schema: dict[str, Any]) -> None:
    """An error is JSON even where the route answers audio or text: FastAPI gives an extra
    response the route's own media type."""
    for operations in schema["paths"].values():
        for operation in operations.values():
            for status, answer in operation.get("responses", {}).items():
                content = answer.get("content", {})
                if status >= "400" and content and "application/json" not in content:
                    (body,) = content.values()
                    answer["content"] = {"application/json": body}


def _drop_unused_422(schema: dict[str, Any]) -> None:
    """FastAPI documents a 422 for every route with parameters; ours answer 400 instead."""
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            answer = operation.get("responses", {}).get("422", {})
            content = answer.get("content", {}).get("application/json", {})
            if content.get("schema", {}).get("$ref", "").endswith("/HTTPValidationError"):
                del operation["responses"]["422"]
    if SCHEMA_REF.format(model="HTTPValidationError") not in json.dumps(schema["paths"]):
        schemas = schema["components"]["schemas"]
        for name in ("HTTPValidationError", "ValidationError"):  # FastAPI's, used by no route
            schemas.pop(name, None)
