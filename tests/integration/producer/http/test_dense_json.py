"""A JSON body dense with items, against the real front: the parser holds the front's event
loop for the whole body (C, under the GIL), and its cost follows the items, not the bytes
(2 MB of `[],[],...` held it ~0.2 s, every tenant's request waiting behind it). Such a body is
refused before it is parsed (COSYQ_HTTP_MAX_JSON_VALUES); a batch of 1,000 real requests, its
texts full of commas and brackets, is not."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import RedisServer
from tests.integration.producer.http.conftest import Front, start_front
from tests.integration.producer.http.test_hostile_requests import no_internal_error, peak_rss_bytes

pytestmark = pytest.mark.slow

BODY_CAP = 2 * 1024 * 1024  # COSYQ_HTTP_MAX_BODY_BYTES' default
LISTS = 690_000  # of `[]`: just under BODY_CAP; parsed, ~50 MB of list objects
PARSED_GROWTH_BYTES = 20 * 1024 * 1024  # the body itself and a copy or two, never its parse
ROUTES = ["/v1/jobs", "/v1/jobs:batch", "/v1/documents", "/v1/audio/speech"]


@pytest.fixture(scope="module")
def front(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Front]:
    """No worker: what is submitted stays queued."""
    started = start_front(tmp_path_factory.mktemp("http-dense"), redis_server.url)
    yield started
    started.stop()


def dense(items: int) -> bytes:
    return b'{"requests": [' + b",".join([b"[]"] * items) + b"]}"


def post(front: Front, path: str, body: bytes) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return httpx.post(front.url + path, content=body, headers=headers, timeout=60)


def test_a_dense_body_is_refused_unparsed(front: Front) -> None:
    body = dense(LISTS)
    assert len(body) < BODY_CAP
    before = peak_rss_bytes(front)
    response = post(front, "/v1/jobs:batch", body)
    grown = peak_rss_bytes(front) - before
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "body_too_large"
    assert "131,072 JSON values and keys (COSYQ_HTTP_MAX_JSON_VALUES)" in error["message"]
    assert grown < PARSED_GROWTH_BYTES, f"the front's peak grew {grown:,} bytes: it was parsed"
    no_internal_error(front)


@pytest.mark.parametrize("path", ROUTES)
def test_every_json_route_counts_before_parsing(front: Front, path: str) -> None:
    response = post(front, path, dense(70_000))
    assert response.status_code == 413, response.text
    assert "COSYQ_HTTP_MAX_JSON_VALUES" in response.json()["error"]["message"]


def test_a_full_batch_of_real_requests_goes_through(front: Front) -> None:
    text = "One, two: three [breath] {four}; five, six. " * 40  # punctuation in a string: no item
    request = {"text": text, "voice": "default", "metadata": {"order": 1, "tags": ["a", "b"]}}
    body = json.dumps({"requests": [request] * 1000}).encode()
    punctuation = len(body) - len(body.translate(None, b",:[{"))
    assert punctuation > 131_072 and len(body) < BODY_CAP  # counted whole, it would be over
    response = post(front, "/v1/jobs:batch", body)
    assert response.status_code == 202, response.text
    assert len(response.json()["ids"]) == 1000
    no_internal_error(front)
