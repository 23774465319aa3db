"""The tenant as the boundary of idempotency keys and output keys (issue 44, items 1 and 2),
tried as a hostile tenant would: `cosyq serve` with three keys (alpha, beta and a plain key of
the default tenant), a worker pool on the scripted engine, a real Redis, real files."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import httpx
import pytest
import redis

from producer import CosyqClient
from shared.results import SynthesisResult
from shared.settings import Settings, load_settings
from shared.tenants import TENANT_META_KEY
from tests.conftest import RedisServer
from tests.doubles.harness import Cluster, json_queue, wait_for
from tests.integration.producer.http.conftest import (
    Front,
    fresh_db,
    start_front,
    stop_front_and_pool,
    submitted_id,
)

KEYS = {
    "alpha": "alpha-key-" + "1" * 20,
    "beta": "beta-key-" + "2" * 20,
    "default": "plain-key-" + "3" * 20,
}
API_KEYS = f"alpha:{KEYS['alpha']},beta:{KEYS['beta']},{KEYS['default']}"
READY_TIMEOUT_S = 90.0


@dataclass
class Scope:
    front: Front
    settings: Settings  # the producer's side, for what HTTP cannot do (a hostile enqueue)

    def http(self, tenant: str) -> httpx.Client:
        return self.front.http(key=KEYS[tenant])


@pytest.fixture(scope="module")
def scope(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scope]:
    root = tmp_path_factory.mktemp("tenant-scope")
    url = fresh_db(redis_server, "scope")
    shared_env = {"COSYQ_API_KEYS": API_KEYS, "COSYQ_DOCUMENT_SEGMENT_CHARS": "200"}
    front = start_front(root / "front", url, **shared_env)
    cluster = Cluster(
        redis_url=url,
        root=root,
        overrides={
            **shared_env,
            "COSYQ_STORAGE_URL": front.storage.as_uri(),
            "COSYQ_MAX_RETRIES": "0",
        },
    )
    pool = cluster.start("pool", "-n", "1", log_name="pool.log")
    try:
        with front.http(key=KEYS["default"]) as http:
            wait_for(
                lambda: http.get("/readyz").status_code == 200,
                READY_TIMEOUT_S,
                "a ready worker behind /readyz",
                interval=0.5,
            )
        settings = load_settings(None, redis_url=url, api_keys=API_KEYS)
        yield Scope(front, settings)
    finally:
        stop_front_and_pool(front, pool, cluster)


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def _ended(http: httpx.Client, job_id: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        doc = http.get(f"/v1/jobs/{job_id}").json()
        if doc["state"] in ("finished", "failed"):
            return doc
        assert time.monotonic() < deadline, f"job {job_id} still {doc['state']}"
        time.sleep(0.1)


def _path(uri: str) -> Path:
    return Path(unquote(urlsplit(uri).path))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---- item 1: idempotency keys


def test_another_tenants_idempotency_key_makes_the_callers_own_job(scope: Scope) -> None:
    job = {"text": "Your order has shipped.", "idempotency_key": "order-42-shipped"}
    with scope.http("alpha") as alpha, scope.http("beta") as beta:
        alphas = submitted_id(alpha.post("/v1/jobs", json=job))
        betas = submitted_id(beta.post("/v1/jobs", json=job))
        assert betas != alphas  # beta's own new job, not alpha's id
        assert beta.get(f"/v1/jobs/{betas}").json()["tenant"] == "beta"
        assert submitted_id(beta.post("/v1/jobs", json=job)) == betas  # dedupes within beta
        assert submitted_id(alpha.post("/v1/jobs", json=job)) == alphas
        # beta claims a key first: alpha's submit of it still makes alpha's job
        first = {"text": "Claimed first.", "idempotency_key": "order-43-shipped"}
        claimed = submitted_id(beta.post("/v1/jobs", json=first))
        own = submitted_id(alpha.post("/v1/jobs", json=first))
        assert own != claimed and alpha.get(f"/v1/jobs/{own}").json()["tenant"] == "alpha"


def test_another_tenants_document_key_does_not_name_its_document(scope: Scope) -> None:
    document = {"text": "One short document.", "idempotency_key": "report-7"}
    with scope.http("alpha") as alpha, scope.http("beta") as beta:
        alphas = submitted_id(alpha.post("/v1/documents", json=document))
        betas = submitted_id(beta.post("/v1/documents", json=document))
        assert betas != alphas  # beta cannot learn alpha's document id from the key
        assert submitted_id(beta.post("/v1/documents", json=document)) == betas
        assert submitted_id(alpha.post("/v1/documents", json=document)) == alphas


def test_a_key_sent_again_with_another_body_names_the_first_job_whatever_it_asks(
    scope: Scope,
) -> None:
    """Within a tenant the key is the request's identity: the body is not compared, so a
    resubmit asking for something else gets the first job (README, Idempotency keys), in a
    batch too; a document's key is apart from a job's."""
    first = {"text": "The first words.", "idempotency_key": "order-44", "format": "wav"}
    other = {"text": "Other words.", "idempotency_key": "order-44", "format": "mp3"}
    with scope.http("alpha") as alpha:
        job_id = submitted_id(alpha.post("/v1/jobs", json=first))
        assert submitted_id(alpha.post("/v1/jobs", json=other)) == job_id
        batch = alpha.post("/v1/jobs:batch", json={"requests": [other, {**other, "seed": 1}]})
        assert batch.status_code == 202 and batch.json()["ids"] == [job_id, job_id]
        assert _ended(alpha, job_id)["result"]["format"] == "wav"  # the first request's
        document = submitted_id(alpha.post("/v1/documents", json=other))
        assert document != job_id


# ---- item 2: output keys


def test_audio_lands_under_the_tenants_prefix_and_a_named_key_stays_there(scope: Scope) -> None:
    storage = scope.front.storage
    with scope.http("alpha") as alpha, scope.http("beta") as beta:
        alphas = submitted_id(alpha.post("/v1/jobs", json={"text": "Alpha speaks."}))
        result = _ended(alpha, alphas)["result"]
        stored = _path(result["uri"])
        relative = stored.relative_to(storage).as_posix()
        assert relative.startswith("tenants/alpha/") and relative.endswith(f"/{alphas}.wav")
        before = _sha256(stored)
        # beta names alpha's automatic key as its own output_key: it lands in beta's prefix
        own_key = relative.removeprefix("tenants/alpha/")
        betas = submitted_id(beta.post("/v1/jobs", json={"text": "Beta.", "output_key": own_key}))
        landed = _path(_ended(beta, betas)["result"]["uri"]).relative_to(storage).as_posix()
        assert landed == f"tenants/beta/{own_key}"
        assert _sha256(stored) == before == result["sha256"]
        assert alpha.get(f"/v1/jobs/{alphas}/audio").content == stored.read_bytes()


@pytest.mark.parametrize("tenant", ["beta", "default"])
def test_a_key_in_another_prefix_or_a_reserved_area_is_refused_at_submit(
    scope: Scope, tenant: str
) -> None:
    refused = [
        "tenants/alpha/2026/12/05/0123abcd.wav",
        "voices/alice/prompt.wav",
        "documents/0123abcd/0123abcd.wav",
        "Tenants/alpha/0123abcd.wav",  # alpha's prefix on a case-insensitive file system
        "VOICES/alice/0123abcd.wav",
    ]
    with scope.http(tenant) as http:
        for key in refused:
            error = _error(http.post("/v1/jobs", json={"text": "x", "output_key": key}), 400)
            assert "output_key" in error["message"] and "reserved" in error["message"], key
            error = _error(http.post("/v1/documents", json={"text": "x", "output_key": key}), 400)
            assert "output_key" in error["message"], key
    assert not (scope.front.storage / "voices").exists()
    assert not list(scope.front.storage.rglob("0123abcd*"))


def test_the_worker_refuses_a_key_outside_the_jobs_tenant_and_keeps_running(
    scope: Scope,
) -> None:
    """What a client writing to Redis directly could enqueue: the worker checks again."""
    connection = redis.Redis.from_url(scope.settings.redis_url)
    queue = json_queue(connection, "cosyq-default.beta")
    meta = {TENANT_META_KEY: "beta"}
    hostile = [
        "tenants/alpha/stolen.wav",  # another tenant's prefix
        "tenants/beta/voices/alice/prompt.wav",  # its own reserved area
        "documents/0123abcd/segments/00000.wav",  # the default tenant's documents
        "stolen-at-the-root.wav",  # outside its prefix altogether
    ]
    jobs = [
        queue.enqueue("workers.tasks.synthesize", request={"text": "x", "output_key": k}, meta=meta)
        for k in hostile
    ]
    fine = queue.enqueue("workers.tasks.synthesize", request={"text": "fine"}, meta=meta)
    with CosyqClient(scope.settings, tenant="beta") as client:
        outcomes = client.wait_many([job.id for job in [*jobs, fine]], timeout=60)
        for job, key in zip(jobs, hostile, strict=True):
            failure = client.status(job.id).failure
            assert failure is not None and failure.kind == "invalid_request", key
            assert "output_key" in failure.message and key in failure.message
            assert not (scope.front.storage / key).exists()
        assert isinstance(outcomes[fine.id], SynthesisResult)  # the worker kept running
    connection.close()


def test_a_tenants_document_is_written_under_its_prefix(scope: Scope) -> None:
    text = " ".join(f"Sentence number {n} of a short report for beta." for n in range(12))
    with scope.http("beta") as beta:
        document_id = submitted_id(beta.post("/v1/documents", json={"text": text}))
    with CosyqClient(scope.settings, tenant="beta") as client:
        result = client.document_result(document_id, timeout=120)
    assert result.segments > 1
    relative = _path(result.uri).relative_to(scope.front.storage).as_posix()
    assert relative == f"tenants/beta/documents/{document_id}/{document_id}.wav"
