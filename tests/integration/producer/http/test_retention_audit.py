"""What a tenant makes goes away when it should (README: Configuration, retention): a front
(`cosyq serve` with its webhook dispatcher) and a worker pool on a Redis of this test's own, with
every retention at its smallest, run each feature two tenants have (jobs, a streamed job, an
idempotency key, a webhook, a failure, a cancel, a document, a voice added, used and deleted,
the request quota); once retention has passed, SCAN lists every key and the storage folder every
file, and only the documented long-lived ones are left: nothing that names one of the tenants'
jobs, documents or voices outlives its retention."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redis
from rq import Queue
from rq.registry import clean_registries

from tests.conftest import RedisServer
from tests.doubles.harness import Cluster, wait_for, write_model_dir
from tests.doubles.webhook_receiver import Receiver, webhook_receiver
from tests.integration.producer.http.conftest import Front, start_front, submitted_id
from tests.integration.producer.webhook_rig import SECRET

ALPHA, BETA = "alpha-key-" + "5" * 20, "beta-key-" + "6" * 20
RETENTION_S = 2  # COSYQ_RESULT_TTL_S, COSYQ_FAILURE_TTL_S, COSYQ_IDEMPOTENCY_TTL_S
DONE_TIMEOUT_S = 60.0
# Keys that live on by design (README): queues and RQ's registries and worker records, the voice
# registry, the webhooks' outbox and its bookkeeping, the operator page's indexes and cursors,
# the orphan sweep's index, a live worker's stats; what they hold is checked below.
LONG_LIVED = (
    "rq:queues",
    "rq:workers",
    "rq:queue:",
    "rq:wip:",
    "rq:finished:",
    "rq:failed:",
    "rq:deferred:",
    "rq:scheduled:",
    "rq:canceled:",
    "rq:worker:",
    "rq:workers:",
    "rq:clean_registries:",
    "rq:intermediate:",
    "cosyq:voices",
    "cosyq:webhooks:outbox",
    "cosyq:webhooks:retry",
    "cosyq:webhooks:unkept",
    "cosyq:index:",
    "cosyq:submitted",
    "cosyq:orphan-suspects",
    "cosyq:worker-stats:",
    "cosyq:document-segment-records",
    "cosyq:document-segments-due",
    "cosyq:document-output-records",
    "cosyq:document-outputs-due",
)


@dataclass
class Rig:
    front: Front
    connection: redis.Redis
    receiver: Receiver

    def http(self, key: str) -> httpx.Client:
        return self.front.http(key=key)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    with started_rig(tmp_path, RETENTION_S) as made:
        yield made


@contextmanager
def started_rig(tmp_path: Path, retention_s: int | None) -> Iterator[Rig]:
    """The front, its dispatcher, a pool of one and a webhook receiver; `retention_s`: the
    results', failures' and idempotency keys' (None: their defaults, a day)."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    with webhook_receiver() as receiver:
        settings = {
            "COSYQ_API_KEYS": f"alpha:{ALPHA},beta:{BETA}",
            "COSYQ_TENANTS": "alpha,beta",
            "COSYQ_TENANT_REQUESTS_PER_MINUTE": "1000",
            "COSYQ_WEBHOOK_SECRET": SECRET,
            "COSYQ_WEBHOOK_ALLOWED_URLS": receiver.url,
            "COSYQ_WEBHOOK_ALLOW_PRIVATE": "1",
            "COSYQ_WEBHOOK_POLL_S": "0.1",
            "COSYQ_DOCUMENT_SEGMENT_CHARS": "200",
        }
        if retention_s is not None:
            for name in ("RESULT_TTL_S", "FAILURE_TTL_S", "IDEMPOTENCY_TTL_S"):
                settings["COSYQ_" + name] = str(retention_s)
        front = start_front(
            tmp_path / "front", server.url, **settings, COSYQ_WEBHOOK_DISPATCH_IN_SERVE="1"
        )
        cluster = Cluster(
            redis_url=server.url,
            root=tmp_path,
            overrides={**settings, "COSYQ_STORAGE_URL": front.storage.as_uri()},
        )
        cluster.start("pool", "-n", "1", log_name="pool.log")
        connection = redis.Redis.from_url(server.url)
        try:
            with front.http(ALPHA) as http:
                wait_for(lambda: http.get("/readyz").status_code == 200, 60, "a ready worker")
            yield Rig(front, connection, receiver)
        finally:
            front.stop()
            cluster.stop_all()
            connection.close()
            server.stop()


def _ended(http: httpx.Client, path: str) -> dict:
    def done() -> dict | None:
        status = http.get(path).json()
        ends = ("finished", "failed", "canceled", "assembled", "incomplete")
        return status if status.get("state") in ends else None

    return wait_for(done, DONE_TIMEOUT_S, f"{path} to end")


def run_every_feature(rig: Rig, prompt: bytes) -> set[str]:
    """Each tenant's jobs, documents and voices; the ids and names they made."""
    made: set[str] = set()
    hook = {"url": rig.receiver.url + "/hook"}
    with rig.http(ALPHA) as alpha, rig.http(BETA) as beta:
        voice = alpha.post(
            "/v1/audio/voices",
            data={"name": "erasable", "transcript": "a test prompt"},
            files={"file": ("prompt.wav", prompt, "audio/wav")},
        )
        assert voice.status_code == 201, voice.text
        made.add(voice.json()["job_id"])
        requests = [
            {"text": "A plain job."},
            {"text": "A streamed job.", "stream": True},
            {"text": "A keyed job.", "idempotency_key": "order-1"},
            {"text": "A hooked job.", "webhook": hook},
            {"text": "fail: on purpose"},
            {"text": "With a voice.", "voice": "erasable"},
            {"text": "Its own name.", "output_key": "named/take"},
        ]
        jobs = [(alpha, submitted_id(alpha.post("/v1/jobs", json=r))) for r in requests]
        jobs.append((beta, submitted_id(beta.post("/v1/jobs", json={"text": "sleep:1 Beta."}))))
        doomed = submitted_id(beta.post("/v1/jobs", json={"text": "Canceled."}))
        assert beta.delete(f"/v1/jobs/{doomed}").status_code in (200, 409)
        document = alpha.post("/v1/documents", json={"text": "One. " * 60, "webhook": hook})
        document_id = submitted_id(document)
        book = {"text": "Two. " * 60, "output_key": "named/book"}  # the caller's: it stays
        named_document = submitted_id(alpha.post("/v1/documents", json=book))
        for http, job_id in [*jobs, (beta, doomed)]:
            _ended(http, f"/v1/jobs/{job_id}")
            made.add(job_id)
        for made_document in (document_id, named_document):
            _ended(alpha, f"/v1/documents/{made_document}")
            made.add(made_document)
        assert beta.delete("/v1/audio/voices/erasable").status_code == 404  # not beta's
        assert alpha.delete("/v1/audio/voices/erasable").status_code == 204
    wait_for(lambda: len(rig.receiver.calls) >= 2, 30, "the webhooks")
    return made


def _name(raw: bytes) -> str:
    return raw.decode(errors="replace")


def leftovers(connection: redis.Redis, made: set[str]) -> list[str]:
    """Every key left with no TTL that is not a documented long-lived one or names what the
    tenants made, and every member of a long-lived one that names it."""
    found = []
    for raw in connection.scan_iter(count=1000):
        key = _name(raw)
        ttl = connection.ttl(raw)
        if ttl != -1:
            continue  # it goes (a body's or an event id's marker may outlive the result)
        if not key.startswith(LONG_LIVED) or any(thing in key for thing in made):
            found.append(f"{key} (no TTL)")
        else:
            found += [f"{key} holds {member}" for member in _members(connection, raw, made)]
    return found


def _members(connection: redis.Redis, key: bytes, made: set[str]) -> list[str]:
    kind = _name(connection.type(key))
    if kind == "hash":
        held = [_name(k) + " " + _name(v) for k, v in connection.hgetall(key).items()]
    elif kind == "zset":
        held = [_name(m) for m in connection.zrange(key, 0, -1)]
    elif kind == "set":
        held = [_name(m) for m in connection.smembers(key)]
    elif kind == "list":
        held = [_name(m) for m in connection.lrange(key, 0, -1)]
    elif kind == "stream":
        held = [str(fields) for _, fields in connection.xrange(key)]
    else:
        held = [_name(connection.get(key) or b"")]
    return sorted({thing for thing in made for member in held if thing in member})


def after_retention(rig: Rig) -> None:
    """What runs on its own in a deployment: each tenant's next submit trims its indexes (README:
    the operator's page), RQ's registry maintenance (a worker's, every 10 minutes) drops its
    expired entries; then the workers' heartbeats do the rest."""
    with rig.http(ALPHA) as alpha, rig.http(BETA) as beta:
        later = [
            (alpha, "/v1/jobs/" + submitted_id(alpha.post("/v1/jobs", json={"text": "Later."}))),
            (beta, "/v1/jobs/" + submitted_id(beta.post("/v1/jobs", json={"text": "Later."}))),
        ]
        document = alpha.post("/v1/documents", json={"text": "Later. " * 40})
        later.append((alpha, "/v1/documents/" + submitted_id(document)))
        for http, path in later:
            _ended(http, path)
    for name in rig.connection.smembers("rq:queues"):
        queue = Queue(_name(name).removeprefix("rq:queue:"), connection=rig.connection)
        clean_registries(queue)


def test_everything_a_tenant_made_goes_once_retention_passes(rig: Rig, tmp_path: Path) -> None:
    prompt = (write_model_dir(tmp_path / "prompt") / "prompt.wav").read_bytes()
    made = run_every_feature(rig, prompt)
    files = stored_files(rig.front.storage)
    time.sleep(RETENTION_S + 1)
    after_retention(rig)
    try:
        wait_for(lambda: not leftovers(rig.connection, made), 30, "retention to pass")
    except AssertionError:
        pytest.fail("left after retention:\n" + "\n".join(leftovers(rig.connection, made)))
    # a job's audio and note, its voice's recording, a document's file, manifest, captions
    # and segments, and the folders named by its id: all gone
    try:
        wait_for(lambda: not stored_left(rig, files, made), 30, "the stored audio to go")
    except AssertionError:
        pytest.fail("stored after retention:\n" + "\n".join(stored_left(rig, files, made)))


def stored_left(rig: Rig, before: list[str], made: set[str]) -> list[str]:
    """Stored files of the first round still there, and folders named by what the tenants made,
    but the files at a caller's output_key (COSYQ_AUDIO_RETENTION=unnamed, the default, keeps
    them: a job's audio, a document's file, manifest and captions), which must still be
    there."""
    now = set(stored_files(rig.front.storage))
    named = [n for n in before if "/named/" in n]  # take.wav, book.wav .json .srt .vtt, notes
    products = {Path(n).name for n in named if not n.endswith(".cosyq.json")}
    assert products == {"take.wav", "book.wav", "book.json", "book.srt", "book.vtt"}
    assert all(n in now for n in named), "a caller's output_key must stay"
    folders = [
        str(path.relative_to(rig.front.storage))
        for path in rig.front.storage.rglob("*")
        if path.is_dir() and any(thing in path.name for thing in made)
    ]
    return [name for name in before if name in now and name not in named] + folders


def stored_files(root: Path) -> list[str]:
    return sorted(str(path.relative_to(root)) for path in root.rglob("*") if path.is_file())
