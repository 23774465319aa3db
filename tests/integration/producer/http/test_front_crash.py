"""`cosyq serve` killed (SIGKILL) at the worst moment of a submit, then started again, as a
supervisor restarts it: the client's retry with its idempotency key must get the thing it
asked for (the one that went in, or a new one), never an id of nothing.

The kill lands deterministically: the front reaches Redis through a proxy that holds back
its submit's transaction (tests/doubles/redis_proxy.py), everything it sent before that (its
reads of the idempotency key and the queue depths) applied, and the test kills it there.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import RedisServer
from tests.doubles.redis_proxy import HoldingProxy
from tests.integration.producer.http.conftest import DATABASES, fresh_db, start_front

CLAIM_TIMEOUT_S = 60.0  # a bound for something that happens at once, never a guess at a race
DOCUMENT = {"text": "First sentence. Second sentence.", "idempotency_key": "chapter-1"}


def _post_until_killed(url: str, body: dict) -> None:
    """POST that the front dies under (the connection drops: no answer is the point)."""
    with contextlib.suppress(httpx.TransportError):
        httpx.post(url, json=body, timeout=CLAIM_TIMEOUT_S * 2)


def _killed_at_the_exec(proxy: HoldingProxy, root: Path, path: str, body: dict) -> None:
    """POST `body` to a front behind `proxy`; SIGKILL it once its transaction that enqueues
    jobs is held."""
    front = start_front(root, proxy.url(DATABASES["crash"]))
    try:
        proxy.hold_next_exec(b"rq:job:")
        poster = threading.Thread(target=_post_until_killed, args=(front.url + path, body))
        poster.start()
        assert proxy.held.wait(CLAIM_TIMEOUT_S), "the front never sent its transaction"
        front.process.send_signal(signal.SIGKILL)
        front.process.wait(timeout=CLAIM_TIMEOUT_S)
        poster.join(CLAIM_TIMEOUT_S)
    finally:
        front.stop()


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/jobs", {"text": "Hello.", "idempotency_key": "order-42"}), ("/v1/documents", DOCUMENT)],
    ids=["job", "document"],
)
def test_a_key_whose_front_died_at_the_exec_gets_a_real_one_at_once(
    redis_server: RedisServer, tmp_path: Path, path: str, body: dict
) -> None:
    url = fresh_db(redis_server, "crash")
    proxy = HoldingProxy(redis_server.port)
    try:
        _killed_at_the_exec(proxy, tmp_path / "first", path, body)
    finally:
        proxy.close()
    connection = redis.Redis.from_url(url)
    assert not connection.keys("rq:job:*") and not connection.keys("cosyq:document:*")

    # restarted at once, with every default: the client's retry must find what it names
    restarted = start_front(tmp_path / "second", url)
    try:
        with restarted.http(None) as http:
            answer = http.post(path, json=body)
            assert answer.status_code == 202, answer.text
            named = answer.json()["id"]
            status = http.get(f"{path}/{named}")
            assert status.status_code == 200, status.text  # never the killed submit's id
            assert http.post(path, json=body).json()["id"] == named
    finally:
        restarted.stop()


def test_a_document_retry_killed_at_its_exec_leaves_the_document_as_it_was(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The retry's new job ids go in with its jobs: a front killed before the jobs went in
    leaves no id in the document's jobs hash that names no job."""
    url = fresh_db(redis_server, "crash")
    connection = redis.Redis.from_url(url, decode_responses=True)
    front = start_front(tmp_path / "front", url)
    try:
        with front.http(None) as http:
            document_id = http.post("/v1/documents", json=DOCUMENT).json()["id"]
            assert http.delete(f"/v1/documents/{document_id}").json()["state"] == "canceled"
    finally:
        front.stop()
    jobs_key = f"cosyq:document:{document_id}:jobs"
    before = connection.hgetall(jobs_key)
    proxy = HoldingProxy(redis_server.port)
    try:
        _killed_at_the_exec(proxy, tmp_path / "first", f"/v1/documents/{document_id}:retry", {})
    finally:
        proxy.close()
    assert connection.hgetall(jobs_key) == before  # every id still names its (canceled) job

    restarted = start_front(tmp_path / "second", url)
    try:
        with restarted.http(None) as http:
            retried = http.post(f"/v1/documents/{document_id}:retry")
            assert retried.status_code == 202, retried.text
            assert retried.json()["queued"] == len(before)
    finally:
        restarted.stop()
    assert all(connection.exists(f"rq:job:{job_id}") for job_id in connection.hvals(jobs_key))
