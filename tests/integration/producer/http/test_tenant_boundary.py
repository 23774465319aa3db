"""The tenant as the boundary over real HTTP (issue 44, items 3, 4, 5 and /metrics of 9): two
tenants' keys (alpha, beta), a plain key (tenant default) and an operator key on `cosyq serve`,
a tiny-model worker behind it, a real Redis.

Voices and documents are per tenant; shared voices are an operator's; a job without a tenant
tag is nobody's; /metrics names tenants only to an operator key.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from rq.job import Job
from rq.results import Result
from rq.serializers import JSONSerializer

from shared import keys
from shared.document_state import document_key
from shared.voices import VoiceRegistry
from tests.conftest import RedisServer
from tests.doubles.harness import wait_for
from tests.integration.producer.http.conftest import Front, fresh_db, start_front, start_tiny_pool

ALPHA, BETA = "alpha-key-" + "1" * 20, "beta-key-" + "2" * 20
PLAIN, OPERATOR = "plain-key-" + "3" * 20, "operator-key-" + "4" * 20
DONE_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def front(
    redis_server: RedisServer, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Front]:
    root = tmp_path_factory.mktemp("http-boundary")
    front = start_front(
        root / "front",
        fresh_db(redis_server, "boundary"),
        COSYQ_API_KEYS=f"alpha:{ALPHA},beta:{BETA},{PLAIN}",
        COSYQ_OPERATOR_KEYS=OPERATOR,
    )
    cluster = start_tiny_pool(root, front, tiny_model_dir, COSYQ_TENANTS="alpha,beta")
    try:
        yield front
    finally:
        front.stop()
        cluster.stop_all()


@pytest.fixture
def prompt(tiny_model_dir: Path) -> bytes:
    return (tiny_model_dir / "prompt.wav").read_bytes()


def _upload(http: httpx.Client, name: str, audio: bytes, transcript: str, **form: str):
    return http.post(
        "/v1/audio/voices",
        data={"name": name, "transcript": transcript, **form},
        files={"file": ("prompt.wav", audio, "audio/wav")},
    )


def _speech(voice: str) -> dict[str, str]:
    return {"model": "cosyvoice2", "input": "Hi.", "voice": voice, "response_format": "wav"}


def _listed(http: httpx.Client) -> dict[str, bool]:
    """name -> shared, of the voices a key lists (the built-in default left out)."""
    voices = http.get("/v1/audio/voices").json()["voices"]
    return {v["name"]: v.get("shared", False) for v in voices if not v["builtin"]}


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def _finished(http: httpx.Client, job_id: str) -> dict:
    def done() -> dict | None:
        status = http.get(f"/v1/jobs/{job_id}").json()
        return status if status["state"] in ("finished", "failed") else None

    return wait_for(done, DONE_TIMEOUT_S, f"job {job_id} to end", interval=0.2)


def test_voices_are_per_tenant_and_shared_voices_are_an_operators(
    front: Front, prompt: bytes
) -> None:
    connection = redis.Redis.from_url(front.redis_url)
    with front.http(ALPHA) as alpha, front.http(BETA) as beta, front.http(OPERATOR) as op:
        added = _upload(alpha, "alice", prompt, "Alpha's Alice.")
        assert added.status_code == 201, added.text
        assert _listed(alpha) == {"alice": False}
        assert _listed(beta) == {}  # beta lists none of alpha's voices ...
        spoken = beta.post("/v1/audio/speech", json=_speech("alice"))
        assert _error(spoken, 404)["code"] == "voice_not_found"  # ... nor speaks with them
        assert _error(beta.delete("/v1/audio/voices/alice"), 404)["code"] == "voice_not_found"
        for name in ("alice", "zed"):  # alpha's voice answers as one nobody registered
            refusals = [
                beta.post("/v1/jobs", json={"text": "Hi.", "voice": name}),
                beta.post("/v1/jobs:batch", json={"requests": [{"text": "Hi.", "voice": name}]}),
                beta.post("/v1/documents", json={"text": "Hi. Bye.", "voice": name}),
            ]
            for refused in refusals:
                error = _error(refused, 404)
                assert error["code"] == "voice_not_found" and "for tenant beta" in error["message"]
        assert connection.llen("rq:queue:cosyq-default.beta") == 0  # nothing queued
        own = _upload(beta, "alice", prompt, "Beta's Alice.")  # beta's own, alpha's untouched
        assert own.status_code == 201 and own.json()["voice"]["replaced"] is False
        kept = VoiceRegistry(connection, "alpha").load("alice").summary
        assert kept.transcript == "Alpha's Alice." and "/voices/alpha/alice/" in kept.source_uri
        assert beta.delete("/v1/audio/voices/alice").status_code == 204
        assert _listed(alpha) == {"alice": False} and _listed(beta) == {}

        refused = _upload(beta, "narrator", prompt, "Beta.", shared="true")
        assert _error(refused, 403)["code"] == "operator_key_required"
        published = _upload(op, "narrator", prompt, "The narrator.", shared="true")
        assert published.status_code == 201 and published.json()["voice"]["shared"] is True
        assert _listed(alpha) == {"alice": False, "narrator": True}
        assert _listed(beta) == {"narrator": True}
        stored = VoiceRegistry(connection, keys.SHARED_VOICES).load("narrator").summary
        assert "/voices/_shared/narrator/" in str(stored.source_uri)
        assert _upload(beta, "narrator", prompt, "Mine.", shared="true").status_code == 403
        denied = beta.delete("/v1/audio/voices/narrator", params={"shared": "true"})
        assert _error(denied, 403)["code"] == "operator_key_required"
        speech = beta.post("/v1/audio/speech", json=_speech("narrator"))
        assert speech.status_code == 200 and speech.content[:4] == b"RIFF"
        job = alpha.post("/v1/jobs", json={"text": "Hello.", "voice": "alice"}).json()
        assert _finished(alpha, job["id"])["state"] == "finished"

        assert op.delete("/v1/audio/voices/narrator", params={"shared": "true"}).status_code == 204
        assert _listed(beta) == {}
    connection.close()


def _assembled(http: httpx.Client, document_id: str) -> dict:
    def done() -> dict | None:
        status = http.get(f"/v1/documents/{document_id}").json()
        return status if status["state"] in ("assembled", "failed", "incomplete") else None

    return wait_for(done, DONE_TIMEOUT_S, f"document {document_id}", interval=0.3)


def test_documents_answer_404_to_every_other_tenant_and_assemble_in_their_own(
    front: Front,
) -> None:
    text = "The first sentence is here. " * 3 + "\n\n" + "And a second paragraph follows. " * 3
    with front.http(ALPHA) as alpha:
        document_id = alpha.post("/v1/documents", json={"text": text}).json()["id"]
        assert _assembled(alpha, document_id)["state"] == "assembled"
        assert alpha.get(f"/v1/documents/{document_id}/audio").status_code == 200
    paths = ("", "/audio", "/captions", "/captions?format=srt")
    for key in (BETA, PLAIN):
        with front.http(key) as other:
            never = _error(other.get("/v1/documents/" + "0" * 32), 404)
            for path in paths:
                hidden = _error(other.get(f"/v1/documents/{document_id}{path}"), 404)
                assert hidden["code"] == "document_not_found", path
                assert hidden["message"] == never["message"].replace("0" * 32, document_id)
            assert _error(other.delete(f"/v1/documents/{document_id}"), 404)
    with front.http(OPERATOR) as op:  # reads any tenant's document, cancels none
        assert op.get(f"/v1/documents/{document_id}").json()["state"] == "assembled"
        assert _error(op.delete(f"/v1/documents/{document_id}"), 403)["code"] == "not_owner"
    with front.http(ALPHA) as alpha:  # beta's DELETE changed nothing
        assert alpha.get(f"/v1/documents/{document_id}").json()["state"] == "assembled"
    connection = redis.Redis.from_url(front.redis_url)
    assembly = connection.get(document_key(document_id, "assembly"))
    assert assembly is not None
    job = Job.fetch(assembly.decode(), connection=connection, serializer=JSONSerializer)
    assert job.origin == "cosyq-default.alpha" and job.meta["cosyq_tenant"] == "alpha"
    connection.close()


def test_a_job_without_its_tenant_tag_is_nobodys_but_an_operator_reads_it(
    front: Front,
) -> None:
    with front.http(ALPHA) as alpha:
        job_id = alpha.post("/v1/jobs", json={"text": "Untagged soon."}).json()["id"]
        assert _finished(alpha, job_id)["tenant"] == "alpha"
    connection = redis.Redis.from_url(front.redis_url)
    # What a worker leaves when the hash was deleted while the job ran: RQ saves it again at
    # the end without its meta (rq's save(include_meta=False)), so the tenant tag is gone.
    assert connection.hdel(Job.key_for(job_id), "meta") == 1
    connection.close()
    for key in (ALPHA, BETA, PLAIN):  # the plain key is tenant "default": no fallback to it
        with front.http(key) as client:
            for method, path in (("GET", ""), ("GET", "/audio"), ("DELETE", "")):
                hidden = _error(client.request(method, f"/v1/jobs/{job_id}{path}"), 404)
                assert hidden["code"] == "job_not_found"
    with front.http(OPERATOR) as op:
        status = op.get(f"/v1/jobs/{job_id}")
        assert status.status_code == 200 and status.json()["tenant"] is None
        assert _error(op.delete(f"/v1/jobs/{job_id}"), 403)["code"] == "not_owner"


def test_metrics_name_tenants_to_an_operator_key_only(front: Front) -> None:
    with front.http(BETA) as beta:
        assert beta.post("/v1/jobs", json={"text": "x", "priority": "low"}).status_code == 202
    for key in (None, BETA, PLAIN):
        with front.http(key) as client:
            page = client.get("/metrics")
        assert page.status_code == 200
        assert "alpha" not in page.text and "beta" not in page.text, key
        assert "cosyq_tenant_queued_jobs" not in page.text
        shown = 'cosyq_queue_depth{queue="cosyq-low"}' in page.text  # the key's own tenant's
        assert shown == (key is not None), key  # no key: no queue depth at all
    with front.http("not-a-key") as stranger:
        assert _error(stranger.get("/metrics"), 401)["code"] == "invalid_api_key"
    with front.http(OPERATOR) as op:
        page = op.get("/metrics").text
    assert 'cosyq_tenant_queued_jobs{tenant="beta"}' in page
    assert 'cosyq_queue_depth{queue="cosyq-low.beta"}' in page


def _rewrite_result(connection: redis.Redis, job_id: str, uri: str) -> None:
    """The job's result as a writer with Redis access could rewrite it: another `uri`."""
    job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
    latest = job.latest_result()
    assert latest is not None and isinstance(latest.return_value, dict)
    rewritten = {**latest.return_value, "uri": uri}
    Result.create(job, Result.Type.SUCCESSFUL, ttl=600, return_value=rewritten)


def _hidden_like_unknown(response: httpx.Response, unknown: httpx.Response, name: str) -> None:
    """Answered exactly as an id never made is (its id aside): 404, same code, same text."""
    never = _error(unknown, 404)
    hidden = _error(response, 404)
    assert hidden["code"] == never["code"]
    assert hidden["message"] == never["message"].replace("0" * 32, name)


def test_a_result_rewritten_in_redis_relays_nothing_outside_its_tenants_area(
    front: Front,
) -> None:
    """Defense in depth: a job's audio is read only from its own tenant's area of the storage,
    judged on the path as it is opened (percent-decoded), whatever its result in Redis says."""
    ids: dict[str, str] = {}
    uris: dict[str, str] = {}
    for name, key in (("alpha", ALPHA), ("beta", BETA), ("default", PLAIN)):
        with front.http(key) as client:
            ids[name] = client.post("/v1/jobs", json={"text": f"Owned by {name}."}).json()["id"]
            uris[name] = _finished(client, ids[name])["result"]["uri"]
            assert client.get(f"/v1/jobs/{ids[name]}/audio").status_code == 200
    beta_under_alpha = uris["beta"].replace("/tenants/beta/", "/tenants/alpha/%2E%2E/beta/")
    assert beta_under_alpha != uris["beta"]
    rewrites = (
        ("alpha", ALPHA, uris["beta"]),  # another tenant's file
        ("alpha", OPERATOR, beta_under_alpha),  # '..' only once decoded; an operator reads too
        ("default", PLAIN, uris["beta"]),  # the default tenant owns no tenants/ prefix
    )
    connection = redis.Redis.from_url(front.redis_url)
    for owner, key, uri in rewrites:
        _rewrite_result(connection, ids[owner], uri)
        job_id = ids[owner]
        with front.http(key) as client:
            for path in ("/v1/jobs/{}/audio", "/ui/jobs/{}/audio", "/ui/jobs/{}/waveform.png"):
                unknown = client.get(path.format("0" * 32))
                _hidden_like_unknown(client.get(path.format(job_id)), unknown, job_id)
    connection.close()
    warned = [e for e in front.events() if e.get("event") == "stored_uri_not_owned"]
    assert {(e["owner"], e["uri"]) for e in warned} == {
        ("alpha", uris["beta"]),
        ("default", uris["beta"]),
    }
    outside = [e for e in front.events() if e.get("event") == "stored_uri_outside_storage"]
    assert ("alpha", beta_under_alpha) in {(e["owner"], e["uri"]) for e in outside}  # no key


def test_a_document_result_rewritten_in_redis_relays_nothing_outside_its_tenants_area(
    front: Front,
) -> None:
    with front.http(BETA) as beta:
        job_id = beta.post("/v1/jobs", json={"text": "Beta's own words."}).json()["id"]
        beta_uri = _finished(beta, job_id)["result"]["uri"]
    with front.http(ALPHA) as alpha:
        document_id = alpha.post("/v1/documents", json={"text": "A short one."}).json()["id"]
        assert _assembled(alpha, document_id)["state"] == "assembled"
    connection = redis.Redis.from_url(front.redis_url)
    result_key = document_key(document_id, "result")
    raw = connection.get(result_key)
    assert raw is not None
    rewritten = {**json.loads(raw), "uri": beta_uri, "vtt_uri": beta_uri}
    connection.set(result_key, json.dumps(rewritten), keepttl=True)
    connection.close()
    with front.http(ALPHA) as alpha:
        for path in (
            "/v1/documents/{}/audio",
            "/v1/documents/{}/captions",
            "/ui/documents/{}",
            "/ui/documents/{}/audio",
        ):
            unknown = alpha.get(path.format("0" * 32))
            hidden = alpha.get(path.format(document_id))
            _hidden_like_unknown(hidden, unknown, document_id)
    warned = [e for e in front.events() if e.get("event") == "stored_uri_not_owned"]
    assert {e["owner"] for e in warned if e["uri"] == beta_uri} >= {"alpha"}


def _outside(front: Front) -> tuple[str, ...]:
    """URIs a result rewritten in Redis could name outside the front's storage: any file,
    a sibling folder of the storage, another bucket (with a password, never to be logged)."""
    sibling = front.storage.parent / (front.storage.name + "-other") / "tenants/alpha/x.wav"
    return ("file:///etc/passwd", sibling.as_uri(), "s3://minio:s3-pass-9K@other/x.wav")


def test_a_result_rewritten_to_outside_the_storage_answers_as_an_unknown_job(
    front: Front,
) -> None:
    """A job's result naming a URI outside COSYQ_STORAGE_URL is answered exactly as a job that
    never existed on every route that reads it (not a 500 that tells it apart), and logged for
    the operator with the URI's password masked."""
    with front.http(ALPHA) as client:
        job_id = client.post("/v1/jobs", json={"text": "Outside the storage."}).json()["id"]
        _finished(client, job_id)
    connection = redis.Redis.from_url(front.redis_url)
    for uri in _outside(front):
        _rewrite_result(connection, job_id, uri)
        for key in (ALPHA, OPERATOR):  # an operator, who reads every tenant's, neither
            with front.http(key) as client:
                for path in ("/v1/jobs/{}/audio", "/ui/jobs/{}/audio", "/ui/jobs/{}/waveform.png"):
                    unknown = client.get(path.format("0" * 32))
                    _hidden_like_unknown(client.get(path.format(job_id)), unknown, job_id)
    connection.close()
    warned = [e for e in front.events() if e.get("event") == "stored_uri_outside_storage"]
    expected = {u.replace("s3-pass-9K", "***") for u in _outside(front)}
    assert {e["uri"] for e in warned} >= expected  # the module's front logs other tests too
    assert {e["storage"] for e in warned} == {front.storage.as_uri()}
    assert "s3-pass-9K" not in front.log.read_text()


DOCUMENT_READS = {  # a document result's field -> the routes that read the file it names
    "uri": ("/v1/documents/{}/audio", "/ui/documents/{}/audio"),
    "vtt_uri": ("/v1/documents/{}/captions", "/ui/documents/{}"),
    "srt_uri": ("/v1/documents/{}/captions?format=srt",),
    "manifest_uri": ("/ui/documents/{}",),
}


def test_a_document_result_rewritten_to_outside_the_storage_answers_as_unknown(
    front: Front,
) -> None:
    """Each of a document's files (audio, captions, the manifest the /ui page reads) named
    outside the storage: every route that reads it answers as for an unknown document."""
    with front.http(ALPHA) as alpha:
        document_id = alpha.post("/v1/documents", json={"text": "Kept inside."}).json()["id"]
        assert _assembled(alpha, document_id)["state"] == "assembled"
    connection = redis.Redis.from_url(front.redis_url)
    result_key = document_key(document_id, "result")
    raw = connection.get(result_key)
    assert raw is not None
    for field, paths in DOCUMENT_READS.items():
        for uri in _outside(front):
            connection.set(result_key, json.dumps({**json.loads(raw), field: uri}), keepttl=True)
            with front.http(ALPHA) as alpha:
                for path in paths:
                    unknown = alpha.get(path.format("0" * 32))
                    hidden = alpha.get(path.format(document_id))
                    _hidden_like_unknown(hidden, unknown, document_id)
    connection.close()


def test_a_front_on_another_storage_answers_its_workers_results_as_unknown(
    front: Front, tmp_path: Path
) -> None:
    """A front whose COSYQ_STORAGE_URL is not the workers' (a misconfiguration): their results
    lie outside its storage, so /v1/audio/speech and a job's audio answer as an unknown job,
    and the front logs why."""
    elsewhere = start_front(
        tmp_path / "elsewhere",
        front.redis_url,
        COSYQ_API_KEYS=f"alpha:{ALPHA},beta:{BETA},{PLAIN}",
        COSYQ_OPERATOR_KEYS=OPERATOR,
    )
    try:
        with elsewhere.http(ALPHA) as client:
            never = _error(client.get("/v1/jobs/" + "0" * 32 + "/audio"), 404)
            spoken = _error(client.post("/v1/audio/speech", json=_speech("default")), 404)
            assert spoken["code"] == never["code"]
            job_id = spoken["message"].split()[2]
            assert spoken["message"] == never["message"].replace("0" * 32, job_id)
            unknown = client.get("/v1/jobs/" + "0" * 32 + "/audio")
            _hidden_like_unknown(client.get(f"/v1/jobs/{job_id}/audio"), unknown, job_id)
        warned = [e for e in elsewhere.events() if e.get("event") == "stored_uri_outside_storage"]
        assert len(warned) == 2 and {e["storage"] for e in warned} == {elsewhere.storage.as_uri()}
        assert all(e["uri"].startswith(front.storage.as_uri() + "/tenants/alpha/") for e in warned)
    finally:
        elsewhere.stop()
