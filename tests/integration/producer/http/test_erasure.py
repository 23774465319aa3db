"""Erasure on demand (producer/erasure.py): `DELETE /v1/jobs/{id}?erase=true` and
`DELETE /v1/documents/{id}?erase=true` with a real front, a worker pool and Redis of this test's
own, retention at its default (a day): once each answers 200, and with no wait for anything,
the storage folder holds no file of what was erased (a caller's `output_key` only until asked
for) and no key in Redis (SCAN, every value read) holds its text or names it but the
documented id-only indexes. Another tenant's id answers as an unknown one, byte for byte; a
second erasure is an unknown id's 404."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import RedisServer
from tests.doubles.harness import Cluster, wait_for
from tests.integration.producer.http.conftest import Front, start_front, submitted_id

ALPHA, BETA = "alpha-key-" + "7" * 20, "beta-key-" + "8" * 20
DONE_TIMEOUT_S = 60.0
# Keys that may still name an erased id (ids only, never text): the operator page's indexes,
# the producer's submitted set, the webhooks' id markers (an event's body: the erased marker).
ID_ONLY = ("cosyq:index:", "cosyq:submitted", "cosyq:webhooks:")


@pytest.fixture
def front(tmp_path: Path) -> Iterator[tuple[Front, redis.Redis]]:
    server = RedisServer(tmp_path / "redis")
    server.start()
    settings = {
        "COSYQ_API_KEYS": f"alpha:{ALPHA},beta:{BETA}",
        "COSYQ_TENANTS": "alpha,beta",
        "COSYQ_TENANT_REQUESTS_PER_MINUTE": "1000",
        "COSYQ_DOCUMENT_SEGMENT_CHARS": "200",
        # webhooks on, no dispatcher: a job's event waits in the outbox, its body kept
        "COSYQ_WEBHOOK_ALLOWED_URLS": "http://127.0.0.1:9/",
        "COSYQ_WEBHOOK_ALLOW_PRIVATE": "1",
    }
    made = start_front(tmp_path / "front", server.url, **settings)
    cluster = Cluster(
        redis_url=server.url,
        root=tmp_path,
        overrides={**settings, "COSYQ_STORAGE_URL": made.storage.as_uri()},
    )
    cluster.start("pool", "-n", "1", log_name="pool.log")
    connection = redis.Redis.from_url(server.url)
    try:
        with made.http(ALPHA) as http:
            wait_for(lambda: http.get("/readyz").status_code == 200, 60, "a ready worker")
        yield made, connection
    finally:
        made.stop()
        cluster.stop_all()
        connection.close()
        server.stop()


def _ended(http: httpx.Client, path: str) -> None:
    ends = ("finished", "failed", "canceled", "assembled", "incomplete")
    wait_for(lambda: http.get(path).json().get("state") in ends, DONE_TIMEOUT_S, f"{path}")


def _stored(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _traces(connection: redis.Redis, marks: list[str]) -> list[str]:
    """Every key whose name or value holds one of `marks` (ids, words of a text), but the
    id-only ones for an id."""
    found = []
    for raw in connection.scan_iter(count=1000):
        key = raw.decode(errors="replace")
        kind = connection.type(raw).decode()
        if kind == "hash":
            held = str(connection.hgetall(raw))
        elif kind == "zset":
            held = str(connection.zrange(raw, 0, -1))
        elif kind == "set":
            held = str(connection.smembers(raw))
        elif kind == "list":
            held = str(connection.lrange(raw, 0, -1))
        elif kind == "stream":
            held = str(connection.xrange(raw))
        else:
            held = str(connection.get(raw))
        for mark in marks:
            text_mark = not mark.isalnum() or mark.startswith("Erasable")
            if mark in key + held and (text_mark or not key.startswith(ID_ONLY)):
                found.append(f"{key} holds {mark}")
    return found


def test_an_erased_job_or_document_leaves_nothing_behind_at_once(
    front: tuple[Front, redis.Redis],
) -> None:
    made, connection = front
    root = made.storage
    with made.http(ALPHA) as alpha, made.http(BETA) as beta:
        plain = submitted_id(alpha.post("/v1/jobs", json={"text": "Erasable plain words."}))
        keyed = {"text": "Erasable keyed words.", "idempotency_key": "erase-1"}
        keyed_id = submitted_id(alpha.post("/v1/jobs", json=keyed))
        named = {"text": "Erasable named words.", "output_key": "named/take"}
        named_id = submitted_id(alpha.post("/v1/jobs", json=named))
        hooked = {
            "text": "Hooked words.",
            "webhook": {"url": "http://127.0.0.1:9/hook"},
            "metadata": {"who": "Erasable metadata"},
        }
        hooked_id = submitted_id(alpha.post("/v1/jobs", json=hooked))
        document = submitted_id(
            alpha.post("/v1/documents", json={"text": "Erasable document words. " * 20})
        )
        book = {"text": "Erasable book words. " * 20, "output_key": "named/book"}
        book_id = submitted_id(alpha.post("/v1/documents", json=book))
        for job_id in (plain, keyed_id, named_id, hooked_id):
            _ended(alpha, f"/v1/jobs/{job_id}")
        for document_id in (document, book_id):
            _ended(alpha, f"/v1/documents/{document_id}")
        ids = [plain, keyed_id, named_id, hooked_id, document, book_id]
        assert any(plain in name for name in _stored(root))

        # another tenant's id: what an unknown id of the same length answers, byte for byte
        unknown = "f" * len(plain)
        theirs = beta.delete(f"/v1/jobs/{plain}", params={"erase": "true"})
        nobody = beta.delete(f"/v1/jobs/{unknown}", params={"erase": "true"})
        assert theirs.status_code == nobody.status_code == 404
        assert theirs.content == nobody.content.replace(unknown.encode(), plain.encode())
        theirs = beta.delete(f"/v1/documents/{document}", params={"erase": "true"})
        nobody = beta.delete(f"/v1/documents/{unknown}", params={"erase": "true"})
        assert theirs.status_code == nobody.status_code == 404
        assert theirs.content == nobody.content.replace(unknown.encode(), document.encode())

        erased = {}
        for path in (f"/v1/jobs/{i}" for i in (plain, keyed_id, hooked_id)):
            erased[path] = alpha.delete(path, params={"erase": "true"})
        path = f"/v1/jobs/{named_id}"  # its output_key asked for too
        erased[path] = alpha.delete(path, params={"erase": "true", "output_key": "true"})
        for path in (f"/v1/documents/{i}" for i in (document, book_id)):
            erased[path] = alpha.delete(path, params={"erase": "true"})
        assert all(r.status_code == 200 for r in erased.values()), [r.text for r in erased.values()]
        assert len(erased[f"/v1/jobs/{plain}"].json()["deleted"]) == 1
        assert erased[f"/v1/jobs/{named_id}"].json()["deleted"][0].endswith("/named/take.wav")
        assert len(erased[f"/v1/documents/{book_id}"].json()["kept"]) == 4  # file, .json, captions
        left = _stored(root)  # the caller's output_key not asked for: it stays, nothing else
        products = {"book.wav", "book.json", "book.srt", "book.vtt"}
        assert {Path(n).name for n in left if not n.endswith(".cosyq.json")} == products
        assert all(
            n.startswith(("tenants/alpha/named/book.", "tenants/alpha/named/.book.")) for n in left
        )
        assert not (root / "tenants/alpha/documents").exists() or not any(
            (root / "tenants/alpha/documents").iterdir()
        )  # no folder named by a document's id
        assert _traces(connection, [*ids, "Erasable"]) == []
        again = alpha.delete(f"/v1/jobs/{plain}", params={"erase": "true"})
        assert again.status_code == 404  # erased: nothing of it left to find
        again = alpha.delete(f"/v1/documents/{document}", params={"erase": "true"})
        assert again.status_code == 404
        # a keyed job's key is free again: the same key makes a new job
        assert submitted_id(alpha.post("/v1/jobs", json=keyed)) != keyed_id


def test_a_running_job_is_stopped_then_erased(front: tuple[Front, redis.Redis]) -> None:
    """A running job is canceled and answers 409 `still_running` (nothing erased: its writer
    could still store audio); once it has stopped, erasing it again erases it. A queued one is
    canceled and erased at once."""
    made, connection = front
    with made.http(ALPHA) as alpha:
        running = submitted_id(alpha.post("/v1/jobs", json={"text": "sleep:30 Erasable slow."}))
        queued = submitted_id(alpha.post("/v1/jobs", json={"text": "Erasable queued."}))
        path = f"/v1/jobs/{running}"
        wait_for(lambda: alpha.get(path).json()["state"] == "started", 60, "it to start")
        # the one worker is busy: the queued job waits until the running one stops
        queued_erased = alpha.delete(f"/v1/jobs/{queued}", params={"erase": "true"})
        stopping = alpha.delete(path, params={"erase": "true"})
        assert stopping.status_code == 409, stopping.text
        assert stopping.json()["error"]["code"] == "still_running"
        assert stopping.headers["retry-after"] == "1"
        assert queued_erased.status_code == 200, queued_erased.text
        assert queued_erased.json() == {
            "id": queued,
            "kind": "job",
            "erased": True,
            "deleted": [],
            "kept": [],
        }
        _ended(alpha, path)
        assert alpha.delete(path, params={"erase": "true"}).status_code == 200
        assert alpha.get(path).status_code == 404
    assert _traces(connection, [running, queued, "Erasable"]) == []
