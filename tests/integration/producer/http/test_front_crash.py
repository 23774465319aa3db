"""`cosyq serve` killed (SIGKILL) at the worst moment of a submit, then started again, as a
supervisor restarts it: the client's retry with its idempotency key must get the thing it
asked for (the one that went in, or a new one), never an id of nothing.

The kill lands deterministically: a front told to block for room (COSYQ_BACKPRESSURE=block)
on a full queue has claimed the request's idempotency key and waits, its transaction not yet
sent, until the test sees the claim in Redis and kills it there.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path

import httpx
import redis

from tests.conftest import RedisServer
from tests.doubles.harness import wait_for
from tests.integration.producer.http.conftest import fresh_db, start_front

CLAIM_TIMEOUT_S = 60.0  # a bound for something that happens at once, never a guess at a race
DOCUMENT = {"text": "First sentence. Second sentence.", "idempotency_key": "chapter-1"}


def _post_until_killed(url: str, body: dict) -> None:
    """POST that the front dies under (the connection drops: no answer is the point)."""
    with contextlib.suppress(httpx.TransportError):
        httpx.post(url, json=body, timeout=CLAIM_TIMEOUT_S * 2)


def test_a_document_key_claimed_by_a_killed_front_gets_a_real_document(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    url = fresh_db(redis_server, "crash")
    connection = redis.Redis.from_url(url)
    blocking = start_front(
        tmp_path / "first",
        url,
        COSYQ_MAX_QUEUE_DEPTH="1",
        COSYQ_BACKPRESSURE="block",
        COSYQ_BACKPRESSURE_TIMEOUT_S="600",
    )
    try:
        with blocking.http(None) as http:
            assert http.post("/v1/jobs", json={"text": "Filler."}).status_code == 202
        poster = threading.Thread(
            target=_post_until_killed, args=(blocking.url + "/v1/documents", DOCUMENT)
        )
        poster.start()
        wait_for(
            lambda: connection.keys("cosyq:document-idem:*"),
            CLAIM_TIMEOUT_S,
            "the document's idempotency key claimed",
        )
        blocking.process.send_signal(signal.SIGKILL)
        blocking.process.wait(timeout=CLAIM_TIMEOUT_S)
        poster.join(CLAIM_TIMEOUT_S)
    finally:
        blocking.stop()
    assert not connection.keys("cosyq:document:*"), "the document went in before the kill"

    # restarted without the queue limit; a claim not enqueued is trusted for no grace here
    restarted = start_front(tmp_path / "second", url, COSYQ_IDEMPOTENCY_CLAIM_GRACE_S="0")
    try:
        with restarted.http(None) as http:
            answer = http.post("/v1/documents", json=DOCUMENT)
            assert answer.status_code == 202, answer.text
            document_id = answer.json()["id"]
            status = http.get(f"/v1/documents/{document_id}")
            assert status.status_code == 200, status.text  # not the killed submit's phantom id
            again = http.post("/v1/documents", json=DOCUMENT)
            assert again.json()["id"] == document_id  # the key holds the new one
    finally:
        restarted.stop()
