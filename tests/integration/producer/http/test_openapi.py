"""The published OpenAPI schema, from a real `cosyq serve`: every route with its methods, the
request bodies as the models the routes check, every example valid against its schema, the
examples accepted by the real front, and real answers valid against the documented responses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import pytest
import redis
from fastapi.routing import APIRoute
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from producer.http.app import KEYED_ROUTERS, OPEN_ROUTERS, REQUEST_MODELS
from shared import keys
from tests.conftest import RedisServer
from tests.integration.producer.http.conftest import API_KEY, Front, fresh_db, start_front

pytestmark = pytest.mark.slow

HOOKS = "https://hooks.example.com/"
# Route -> the body model and the fields a client must find in it.
BODIES = {
    ("post", "/v1/jobs"): ("SynthesisRequest", {"text", "voice", "webhook", "stream", "metadata"}),
    ("post", "/v1/jobs:batch"): ("BatchRequest", {"requests"}),
    ("post", "/v1/documents"): ("DocumentRequest", {"text", "markup", "webhook", "voice"}),
    ("post", "/v1/audio/speech"): ("SpeechRequest", {"model", "input", "voice", "stream_format"}),
    ("post", "/v1/audio/voices"): ("VoiceUpload", {"name", "file", "transcript", "shared"}),
}


@pytest.fixture(scope="module")
def front(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    """Keys on, webhooks allowed under HOOKS (the examples name one), no worker: a job is
    accepted and stays queued; speech answers 504 with its job id after 1 s."""
    url = fresh_db(redis_server, "openapi")
    front = start_front(
        tmp_path_factory.mktemp("http-openapi"),
        url,
        COSYQ_API_KEYS=API_KEY,
        COSYQ_WEBHOOK_ALLOWED_URLS=HOOKS,
        COSYQ_HTTP_WAIT_TIMEOUT_S="1",
    )
    yield front
    front.stop()


@pytest.fixture(scope="module")
def schema(front: Front) -> dict[str, Any]:
    response = httpx.get(front.url + "/openapi.json", timeout=10)  # no key needed
    assert response.status_code == 200
    doc = response.json()
    assert doc["openapi"].startswith("3.1") and doc["info"]["title"] == "cosyq"
    return dict(doc)


def validator(schema: dict[str, Any], name: str) -> jsonschema.Draft202012Validator:
    """A validator for components/schemas/NAME, its $refs resolved in the whole document."""
    document = Resource(contents=schema, specification=DRAFT202012)
    registry: Registry = Registry().with_resource("urn:openapi", document)
    return jsonschema.Draft202012Validator(
        {"$ref": f"urn:openapi#/components/schemas/{name}"}, registry=registry
    )


def response_schema(schema: dict[str, Any], method: str, path: str, status: int) -> str:
    content = schema["paths"][path][method]["responses"][str(status)]["content"]
    answer = content["application/json"]["schema"]
    # a route answering one of several models (DELETE: a cancel's, or with erase an
    # erasure's) lists its plain answer first
    ref = answer["$ref"] if "$ref" in answer else answer["anyOf"][0]["$ref"]
    return str(ref.rsplit("/", 1)[1])


def test_every_route_is_listed_with_its_methods(schema: dict[str, Any]) -> None:
    routes = [r for router in (*OPEN_ROUTERS, *KEYED_ROUTERS) for r in router.routes]
    wanted = {
        (method.lower(), route.path)
        for route in routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }
    listed = {(method, path) for path, ops in schema["paths"].items() for method in ops}
    assert (
        listed == wanted and len(wanted) == 20
    )  # + DELETE voices, POST documents :retry (issues 44, 45)
    keyed = {
        (method.lower(), route.path)
        for router in KEYED_ROUTERS
        for route in router.routes
        if isinstance(route, APIRoute)
        for method in route.methods
    }
    for method, path in listed:
        operation = schema["paths"][path][method]
        assert (operation.get("security") == [{"bearer": []}]) == ((method, path) in keyed)
        if "422" in operation["responses"]:  # a failed document; validation errors are 400s
            assert response_schema(schema, method, path, 422) == "ErrorResponse"
        if (method, path) in keyed:
            assert response_schema(schema, method, path, 400) == "ErrorResponse"
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert "HTTPValidationError" not in schema["components"]["schemas"]


def test_bodies_reference_the_models_with_their_fields(schema: dict[str, Any]) -> None:
    schemas = schema["components"]["schemas"]
    for (method, path), (name, fields) in BODIES.items():
        content = schema["paths"][path][method]["requestBody"]["content"]
        (body,) = content.values()
        assert body["schema"]["$ref"] == f"#/components/schemas/{name}"
        assert fields <= set(schemas[name]["properties"])
    with_body = {
        (method, path)
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
        if "requestBody" in op
    }
    assert with_body == set(BODIES)
    assert {model.__name__ for model in REQUEST_MODELS} == {name for name, _ in BODIES.values()}
    webhook = schemas["SynthesisRequest"]["properties"]["webhook"]["anyOf"][0]["$ref"]
    assert schemas[webhook.rsplit("/", 1)[1]]["required"] == ["url"]
    assert schemas["CancelResponse"]["properties"]["result"]["enum"][:3] == [
        "canceled",
        "stopping",
        "already_canceled",
    ]
    status = schemas["JobStatusResponse"]["properties"]
    assert {"job_id", "state", "result", "error", "submitted"} <= set(status)


def test_every_example_validates_against_its_schema(schema: dict[str, Any]) -> None:
    checked = 0
    for name, body in schema["components"]["schemas"].items():
        for example in body.get("examples", []):
            validator(schema, name).validate(example)
            checked += 1
    assert checked >= 15
    with pytest.raises(jsonschema.ValidationError):  # the validator can fail
        validator(schema, "SynthesisRequest").validate({"text": "hi", "colour": "red"})


def test_the_examples_are_accepted_by_the_front(front: Front, schema: dict[str, Any]) -> None:
    """Each request example, sent as it is: 202 (or, for speech with no worker, 504 after it
    was queued), and every answer valid against the documented response."""
    schemas = schema["components"]["schemas"]
    connection = redis.Redis.from_url(front.redis_url)
    for example in schemas["SynthesisRequest"]["examples"]:  # their voices, as registered
        if example.get("voice") not in (None, "default"):  # (the producer asks that it exists)
            connection.hset(keys.voice_key(example["voice"], keys.DEFAULT_TENANT), "meta", "{}")
    connection.close()
    with front.http() as http:
        for (method, path), (name, _) in BODIES.items():
            if name == "VoiceUpload":
                continue  # multipart: test_jobs_api uploads one
            for example in schemas[name]["examples"]:
                response = http.request(method, path, json=example)
                if name == "SpeechRequest":
                    assert response.status_code == 504, response.text
                    assert response.json()["error"]["code"] == "timeout"
                    validator(schema, "ErrorResponse").validate(response.json())
                    continue
                assert response.status_code == 202, (path, example, response.text)
                answer = response_schema(schema, method, path, 202)
                validator(schema, answer).validate(response.json())
        job_id = http.post("/v1/jobs", json={"text": "Checked against the schema."}).json()["id"]
        document_id = http.post("/v1/documents", json=schemas["DocumentRequest"]["examples"][0])
        answers = [
            ("get", f"/v1/jobs/{job_id}", "/v1/jobs/{job_id}"),
            ("get", f"/v1/documents/{document_id.json()['id']}", "/v1/documents/{document_id}"),
            ("get", "/v1/audio/voices", "/v1/audio/voices"),
            ("delete", f"/v1/jobs/{job_id}", "/v1/jobs/{job_id}"),
        ]
        for method, url, path in answers:
            response = http.request(method, url)
            assert response.status_code == 200, response.text
            validator(schema, response_schema(schema, method, path, 200)).validate(response.json())
        refused = http.post("/v1/jobs", json={"text": "hi", "speed": 9})
    assert refused.status_code == 400
    validator(schema, "ErrorResponse").validate(refused.json())


def test_a_client_built_from_the_schema_alone(front: Front) -> None:
    """What a generated client does: build the body from the schema's required fields and
    defaults, send it, read the answer by the documented fields."""
    with front.http() as http:
        doc = http.get("/openapi.json").json()
        body_schema = doc["components"]["schemas"]["SynthesisRequest"]
        body = {field: "Made from the schema." for field in body_schema["required"]}
        accepted = http.post("/v1/jobs", json=body).json()
        assert set(doc["components"]["schemas"]["JobAccepted"]["required"]) <= set(accepted)
        status = http.get(accepted["location"]).json()
    required = doc["components"]["schemas"]["JobStatusResponse"]["required"]
    assert set(required) <= set(status) and status["state"] == "queued"
