"""What one tenant can learn of another's without reaching it, over real HTTP: `cosyq serve`
with two tenants' keys (alpha, beta) and an operator key, a worker pool on the scripted engine,
a real Redis watched with MONITOR.

Another tenant's job, document, voice, idempotency key or output key answers byte for byte as
one never made (apart from the id or name the request itself sent); refusing another tenant's
job or document reads of Redis what refusing an unknown id reads (the job's hash, the first
bytes of the document's plan), nothing past its tenant; the fleet page shows a tenant key no
count summed over every tenant's jobs.
"""

from __future__ import annotations

import hashlib
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from producer.tracking import OWNED_JOB_SCRIPT
from shared.document_state import PLAN_HEAD_BYTES
from tests.conftest import RedisServer
from tests.doubles.harness import Cluster, wait_for
from tests.integration.producer.http.conftest import (
    Front,
    fresh_db,
    start_front,
    stop_front_and_pool,
    submitted_id,
)

KEYS = {"alpha": "alpha-key-" + "1" * 20, "beta": "beta-key-" + "2" * 20}
OPERATOR = "operator-key-" + "4" * 20
READY_TIMEOUT_S = 90.0
DONE_TIMEOUT_S = 60.0
# What refusing a job reads: one script (tracking.py's _OWNED_JOB) that reads the hash's meta
# for its tenant tag and stops there; MONITOR shows the script's call and the commands it ran.
OWNED_JOB_SHA = hashlib.sha1(OWNED_JOB_SCRIPT.encode()).hexdigest()
OWNED_JOB_READ = [
    f"EVALSHA {OWNED_JOB_SHA} 1 rq:job:ID beta 0 cosyq_tenant",
    "HGET rq:job:ID meta",
]
VARYING_HEADERS = frozenset({"date", "server"})
JOB_ROUTES = (
    ("GET", "/v1/jobs/{}"),
    ("GET", "/v1/jobs/{}/audio"),
    ("GET", "/v1/jobs/{}/captions"),
    ("GET", "/v1/jobs/{}/stream"),
    ("GET", "/v1/jobs/{}/stream?stream_format=sse&format=wav"),
    ("DELETE", "/v1/jobs/{}"),
    ("GET", "/ui/jobs/{}"),
    ("GET", "/ui/jobs/{}/audio"),
    ("GET", "/ui/jobs/{}/waveform.png"),
    ("GET", "/ui/jobs/{}/spectrogram.png"),
    ("POST", "/ui/jobs/{}/judge"),
)
DOCUMENT_ROUTES = (
    ("GET", "/v1/documents/{}"),
    ("GET", "/v1/documents/{}/audio"),
    ("GET", "/v1/documents/{}/captions?format=srt"),
    ("POST", "/v1/documents/{}:retry"),
    ("DELETE", "/v1/documents/{}"),
    ("GET", "/ui/documents/{}"),
    ("GET", "/ui/documents/{}/audio"),
    ("POST", "/ui/documents/{}/cancel"),
)


@dataclass
class Made:
    """What alpha made: a finished job, a streamed one, an assembled document, a voice."""

    front: Front
    job: str
    streamed: str
    document: str
    segment_job: str
    long_document: str  # canceled at once: its plan stays, hundreds of kilobytes of it

    def http(self, tenant: str) -> httpx.Client:
        return self.front.http(key=KEYS.get(tenant, OPERATOR))


@pytest.fixture(scope="module")
def made(
    redis_server: RedisServer, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Made]:
    root = tmp_path_factory.mktemp("tenant-oracles")
    url = fresh_db(redis_server, "oracles")
    env = {"COSYQ_API_KEYS": f"alpha:{KEYS['alpha']},beta:{KEYS['beta']}"}
    front = start_front(root / "front", url, COSYQ_OPERATOR_KEYS=OPERATOR, **env)
    cluster = Cluster(
        redis_url=url,
        root=root,
        overrides={**env, "COSYQ_STORAGE_URL": front.storage.as_uri(), "COSYQ_MAX_RETRIES": "0"},
    )
    pool = cluster.start("pool", "-n", "1", log_name="pool.log")
    try:
        with front.http(key=KEYS["alpha"]) as alpha:
            wait_for(
                lambda: alpha.get("/readyz").status_code == 200, READY_TIMEOUT_S, "a ready worker"
            )
            job = submitted_id(
                alpha.post(
                    "/v1/jobs",
                    json={"text": "Hello.", "idempotency_key": "ord-1", "output_key": "o/1.wav"},
                )
            )
            streamed = submitted_id(alpha.post("/v1/jobs", json={"text": "Hi.", "stream": True}))
            document = submitted_id(
                alpha.post("/v1/documents", json={"text": "One. Two.", "idempotency_key": "d-1"})
            )
            long_text = " ".join(f"Sentence number {i} is here." for i in range(12_000))
            long_document = submitted_id(alpha.post("/v1/documents", json={"text": long_text}))
            assert alpha.delete(f"/v1/documents/{long_document}").status_code == 200
            prompt = (tiny_model_dir / "prompt.wav").read_bytes()
            voice = _upload(alpha, "alice", prompt)
            assert voice.status_code == 201, voice.text
            for job_id in (job, streamed):
                _ended(alpha, job_id)
            wait_for(
                lambda: alpha.get(f"/v1/documents/{document}").json()["state"] == "assembled",
                DONE_TIMEOUT_S,
                "alpha's document to be assembled",
            )
        segment_job = redis.Redis.from_url(url).hget(f"cosyq:document:{document}:jobs", "0")
        assert segment_job is not None
        yield Made(front, job, streamed, document, segment_job.decode(), long_document)
    finally:
        stop_front_and_pool(front, pool, cluster)


def _upload(http: httpx.Client, name: str, audio: bytes) -> httpx.Response:
    return http.post(
        "/v1/audio/voices",
        data={"name": name, "transcript": "A voice."},
        files={"file": ("prompt.wav", audio, "audio/wav")},
    )


def _ended(http: httpx.Client, job_id: str) -> dict[str, Any]:
    def ended() -> dict[str, Any] | None:
        status = http.get(f"/v1/jobs/{job_id}").json()
        return status if status["state"] in ("finished", "failed") else None

    return wait_for(ended, DONE_TIMEOUT_S, f"job {job_id} to end", interval=0.2)


def _answer(response: httpx.Response, sent: str) -> tuple[int, dict[str, str], bytes]:
    """The answer with what the request itself sent (an id, a name) written as `ID`."""
    headers = {
        k: v.replace(sent, "ID") for k, v in response.headers.items() if k not in VARYING_HEADERS
    }
    return response.status_code, headers, response.content.replace(sent.encode(), b"ID")


def _call(http: httpx.Client, method: str, route: str, ident: str) -> httpx.Response:
    return http.request(method, route.format(ident))


def test_another_tenants_ids_answer_byte_for_byte_as_ids_never_made(made: Made) -> None:
    ids = {
        made.job: JOB_ROUTES,
        made.streamed: JOB_ROUTES,
        made.segment_job: JOB_ROUTES,
        made.document: DOCUMENT_ROUTES,
        made.long_document: DOCUMENT_ROUTES,
    }
    with made.http("beta") as beta:
        for theirs, routes in ids.items():
            for method, route in routes:
                never = uuid.uuid4().hex
                other = _answer(_call(beta, method, route, theirs), theirs)
                unknown = _answer(_call(beta, method, route, never), never)
                assert other == unknown, (method, route)
                assert other[0] == 404, (method, route, other)
    with made.http("alpha") as alpha:  # alpha's own objects are all still there
        assert alpha.get(f"/v1/jobs/{made.job}").json()["state"] == "finished"
        assert alpha.get(f"/v1/documents/{made.document}").json()["state"] == "assembled"


def test_another_tenants_names_answer_as_names_never_used(made: Made, tiny_model_dir: Path) -> None:
    """Voice names, idempotency keys and output keys: beta using alpha's gets what beta gets
    for a name nobody used, its own job, document or voice, in its own prefix."""
    speech = {"model": "cosyvoice2", "input": "Hi.", "response_format": "wav"}
    by_name: list[tuple[str, Callable[[httpx.Client, str], httpx.Response]]] = [
        ("DELETE voice", lambda h, n: h.delete(f"/v1/audio/voices/{n}")),
        ("speech", lambda h, n: h.post("/v1/audio/speech", json={**speech, "voice": n})),
        ("job", lambda h, n: h.post("/v1/jobs", json={"text": "Hi.", "voice": n})),
        ("document", lambda h, n: h.post("/v1/documents", json={"text": "A. B.", "voice": n})),
    ]
    with made.http("beta") as beta:
        for what, call in by_name:  # alpha has an alice, nobody a bobby
            theirs = _answer(call(beta, "alice"), "alice")
            assert theirs == _answer(call(beta, "bobby"), "bobby"), what
        replays = [("/v1/jobs", "ord-1", "ord-9"), ("/v1/documents", "d-1", "d-9")]
        for path, alphas, unused in replays:
            theirs = beta.post(path, json={"text": "A. B.", "idempotency_key": alphas})
            fresh = beta.post(path, json={"text": "A. B.", "idempotency_key": unused})
            assert theirs.status_code == fresh.status_code == 202
            assert theirs.json()["id"] not in (made.job, made.document)
            assert _answer(theirs, theirs.json()["id"]) == _answer(fresh, fresh.json()["id"])
        own = submitted_id(beta.post("/v1/jobs", json={"text": "Hi.", "output_key": "o/1.wav"}))
        uri = _ended(beta, own)["result"]["uri"]
        assert uri.endswith("/tenants/beta/o/1.wav"), uri
        prompt = (tiny_model_dir / "prompt.wav").read_bytes()
        uploads = [_upload(beta, name, prompt) for name in ("alice", "bobby")]
        assert [u.json()["voice"]["replaced"] for u in uploads] == [False, False]
    with made.http("alpha") as alpha:  # alpha's audio, untouched by beta's o/1.wav
        assert alpha.get(f"/v1/jobs/{made.job}/audio").status_code == 200


class Monitor:
    """Every command Redis runs on the front's database, as MONITOR reports it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.db = int(url.rsplit("/", 1)[1])
        self.commands: list[str] = []
        self._monitor = redis.Redis.from_url(url).monitor()
        self._monitor.__enter__()
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        try:
            for command in self._monitor.listen():
                if command.get("db") == self.db:
                    self.commands.append(str(command["command"]))
        except (redis.RedisError, OSError, ValueError, AttributeError):
            return  # closed

    def naming(self, http: httpx.Client, method: str, route: str, ident: str) -> list[str]:
        """The commands naming `ident` (written `ID`) that Redis ran for the request."""
        start = len(self.commands)
        _call(http, method, route, ident)
        mark = f"end-{uuid.uuid4().hex}"
        with redis.Redis.from_url(self.url) as connection:
            connection.echo(mark)
        wait_for(lambda: any(mark in c for c in self.commands[start:]), 10, "MONITOR's echo")
        return [c.replace(ident, "ID") for c in self.commands[start:] if ident in c]

    def close(self) -> None:
        self._monitor.__exit__(None, None, None)


@pytest.fixture
def monitor(made: Made) -> Iterator[Monitor]:
    watching = Monitor(made.front.redis_url)
    yield watching
    watching.close()


def test_refusing_another_tenants_job_reads_of_redis_what_an_unknown_id_reads(
    made: Made, monitor: Monitor
) -> None:
    """Only the job's tenant tag, inside Redis, then the refusal: never its hash, its result or
    its failure, which a job never made has none of (a finished job's result stream read
    before the owner check made refusing it slower than refusing an id never made; its whole
    hash, read then refused, sent 2,588 bytes where an unknown id's sent 1,356)."""
    with made.http("beta") as beta:
        for method, route in JOB_ROUTES:
            for theirs in (made.job, made.streamed, made.segment_job):
                never = uuid.uuid4().hex
                # the worker's housekeeping may name alpha's job too: a try that caught one
                # is tried again; a refusal that reads more fails every try
                for _ in range(3):
                    other = monitor.naming(beta, method, route, theirs)
                    unknown = monitor.naming(beta, method, route, never)
                    if other == unknown:
                        break
                assert other == unknown, (method, route)
                assert other == OWNED_JOB_READ, (method, route)


def test_refusing_another_tenants_job_sends_what_refusing_an_unknown_id_sends(made: Made) -> None:
    """Counted by Redis itself (no MONITOR here: it is sent every command): alpha's finished
    job, refused to beta, sent 1,232 bytes more than an id never made (its hash). The least of
    five tries of each leaves out the worker's polls and heartbeats in between."""
    connection = redis.Redis.from_url(made.front.redis_url)
    with made.http("beta") as beta:
        for theirs in (made.job, made.streamed):
            other = min(_bytes_sent(connection, beta, f"/v1/jobs/{theirs}") for _ in range(5))
            unknown = min(
                _bytes_sent(connection, beta, f"/v1/jobs/{uuid.uuid4().hex}") for _ in range(5)
            )
            assert abs(other - unknown) < 512, (other, unknown)


def test_refusing_another_tenants_document_reads_the_head_of_its_plan_alone(
    made: Made, monitor: Monitor
) -> None:
    """A long document's plan is hundreds of kilobytes (every segment's text): read and parsed
    before the owner check, refusing it took milliseconds longer than refusing an id never
    made. Now both read the plan's first bytes (nothing, for an id never made) and stop."""
    connection = redis.Redis.from_url(made.front.redis_url)
    plan_bytes = connection.strlen(f"cosyq:document:{made.long_document}")
    assert plan_bytes > 256 * 1024
    head = f"GETRANGE cosyq:document:ID 0 {PLAN_HEAD_BYTES - 1}"
    with made.http("beta") as beta:
        for method, route in DOCUMENT_ROUTES:
            for theirs in (made.document, made.long_document):
                never = uuid.uuid4().hex
                other = monitor.naming(beta, method, route, theirs)
                unknown = monitor.naming(beta, method, route, never)
                assert other == unknown == [head], (method, route)
        sent = [
            _bytes_sent(connection, beta, f"/v1/documents/{ident}")
            for ident in (made.long_document, "0" * 32)
        ]
        assert abs(sent[0] - sent[1]) < 64 * 1024, (sent, plan_bytes)
    with made.http("alpha") as alpha:  # alpha's own reads go on past the head
        assert alpha.get(f"/v1/documents/{made.long_document}").json()["state"] == "canceled"


def _bytes_sent(connection: redis.Redis, http: httpx.Client, path: str) -> int:
    """What Redis sent its clients while `http` was refused `path` (its server's count: the
    worker's heartbeats add a few hundred bytes, a plan read adds the plan)."""
    before = int(connection.info("stats")["total_net_output_bytes"])
    assert http.get(path).status_code == 404
    return int(connection.info("stats")["total_net_output_bytes"]) - before


def test_a_tenant_key_sees_no_worker_job_counts_summed_over_every_tenant(made: Made) -> None:
    """A worker's jobs done counts every tenant's jobs: beta, subtracting its own, would learn
    how many alpha ran. An operator sees them (and the next recycle, which says the same)."""
    with made.http("beta") as beta, made.http("operator") as operator:
        seen = {who: http.get("/ui").text for who, http in (("beta", beta), ("op", operator))}
    workers = {who: _section(page, "workers") for who, page in seen.items()}
    assert "Jobs done" in workers["op"] and re.search(r"after \d+ jobs", workers["op"])
    assert "Jobs done" not in workers["beta"] and "Next recycle" not in workers["beta"]
    assert not re.search(r"after \d+ jobs", workers["beta"])
    assert "state-idle" in workers["beta"] or "state-busy" in workers["beta"]  # health stays


def _section(page: str, table_id: str) -> str:
    start = page.index(f'<table id="{table_id}">')
    return page[start : page.index("</table>", start)]
