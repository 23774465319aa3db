"""`cosyq serve` killed (SIGKILL) at the worst moment of a submit, then started again, as a
supervisor restarts it: the client's retry with its idempotency key must get the thing it
asked for (the one that went in, or a new one), never an id of nothing.

The same for a voice upload, whose recording is written before its job is enqueued: a worker's
housekeeping deletes it once nothing will name it.

The kill lands deterministically: the front reaches Redis through a proxy that holds back
its submit's transaction (tests/doubles/redis_proxy.py), everything it sent before that (its
reads of the idempotency key and the queue depths) applied, and the test kills it there.
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import redis

from shared import keys
from shared.keys import VOICE_UPLOADS, WEBHOOK_OUTBOX
from shared.settings import load_settings
from shared.storage import open_storage
from tests.conftest import RedisServer
from tests.doubles.redis_proxy import HoldingProxy
from tests.integration.producer.http.conftest import (
    DATABASES,
    Front,
    fresh_db,
    queued_job,
    start_front,
)
from tests.integration.producer.http.test_jobs_api import tone_wav
from tests.integration.producer.webhook_rig import SECRET
from workers.voices.uploads import VoiceUploadSweep

RECEIVER = "http://127.0.0.1:9/"  # never called: the test reads the outbox
CLAIM_TIMEOUT_S = 60.0  # a bound for something that happens at once, never a guess at a race
DOCUMENT = {"text": "First sentence. Second sentence.", "idempotency_key": "chapter-1"}


def _post_until_killed(url: str, body: dict) -> None:
    """POST that the front dies under (the connection drops: no answer is the point)."""
    with contextlib.suppress(httpx.TransportError):
        httpx.post(url, json=body, timeout=CLAIM_TIMEOUT_S * 2)


def _kill_when_held(
    proxy: HoldingProxy, front: Front, marker: bytes, call: Callable[[], None], what: str
) -> None:
    """Run `call` (a request the front dies under) and SIGKILL the front once its transaction
    holding `marker` is held at the proxy (`what`: the assertion's message if it never is)."""
    proxy.hold_next_exec(marker)
    caller = threading.Thread(target=call)
    caller.start()
    assert proxy.held.wait(CLAIM_TIMEOUT_S), what
    front.process.send_signal(signal.SIGKILL)
    front.process.wait(timeout=CLAIM_TIMEOUT_S)
    caller.join(CLAIM_TIMEOUT_S)


def _killed_at_the_exec(proxy: HoldingProxy, root: Path, path: str, body: dict) -> None:
    """POST `body` to a front behind `proxy`; SIGKILL it once its transaction that enqueues
    jobs is held."""
    front = start_front(root, proxy.url(DATABASES["crash"]))
    try:
        post = functools.partial(_post_until_killed, front.url + path, body)
        _kill_when_held(proxy, front, b"rq:job:", post, "the front never sent its transaction")
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


def test_a_document_cancel_killed_midway_has_told_the_documents_end(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The first queued segment's cancel tells `document.canceled` in its own transaction: a
    front killed before it canceled the rest has told it, and the client's retry of the
    cancel (all canceled then) tells nothing more."""
    url = fresh_db(redis_server, "crash")
    connection = redis.Redis.from_url(url, decode_responses=True)
    hooks = {
        "COSYQ_WEBHOOK_SECRET": SECRET,
        "COSYQ_WEBHOOK_ALLOWED_URLS": RECEIVER,
        "COSYQ_WEBHOOK_ALLOW_PRIVATE": "1",
    }
    text = "\n\n".join(f"Paragraph {n} says one thing and then it stops." for n in range(3))
    document = {"text": text, "webhook": {"url": RECEIVER + "hook"}}
    front = start_front(tmp_path / "front", url, COSYQ_DOCUMENT_SEGMENT_CHARS="50", **hooks)
    try:
        with front.http(None) as http:
            answer = http.post("/v1/documents", json=document)
            assert answer.status_code == 202, answer.text
            document_id = answer.json()["id"]
    finally:
        front.stop()
    segments = connection.hgetall(f"cosyq:document:{document_id}:jobs")
    assert len(segments) >= 2

    proxy = HoldingProxy(redis_server.port)
    first = start_front(tmp_path / "first", proxy.url(DATABASES["crash"]), **hooks)
    try:
        cancel = functools.partial(
            _delete_until_killed, f"{first.url}/v1/documents/{document_id}"
        )  # segment 0 canceled, then the kill
        _kill_when_held(
            proxy, first, segments["1"].encode(), cancel, "the front never canceled segment 1"
        )
    finally:
        first.stop()
        proxy.close()
    assert _document_events(connection, document_id) == ["document.canceled"]

    restarted = start_front(tmp_path / "second", url, **hooks)
    try:
        with restarted.http(None) as http:
            again = http.delete(f"/v1/documents/{document_id}")
            assert again.status_code == 200 and again.json()["state"] == "canceled", again.text
    finally:
        restarted.stop()
    assert _document_events(connection, document_id) == ["document.canceled"]  # told once


def _delete_until_killed(url: str) -> None:
    with contextlib.suppress(httpx.TransportError):
        httpx.delete(url, timeout=CLAIM_TIMEOUT_S * 2)


def _document_events(connection: redis.Redis, document_id: str) -> list[str]:
    entries = connection.xrange(WEBHOOK_OUTBOX)
    return [fields["event"] for _, fields in entries if fields["job_id"] == document_id]


def test_a_submit_whose_exec_answer_is_lost_enqueues_its_job_once(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """Redis applies the transaction and the connection drops before its answer (redis-py says
    WatchError for any connection error under WATCH): the front must find its job in, not
    enqueue it again (twice in the queue: synthesized twice, told twice)."""
    url = fresh_db(redis_server, "crash")
    connection = redis.Redis.from_url(url, decode_responses=True)
    proxy = HoldingProxy(redis_server.port)
    front = start_front(tmp_path / "front", proxy.url(DATABASES["crash"]))
    try:
        proxy.cut_next_exec(b"rq:job:")
        with front.http(None) as http:
            answer = http.post("/v1/jobs", json={"text": "Once."})
            assert answer.status_code == 202, answer.text
            job_id = answer.json()["id"]
        assert proxy.held.is_set()
    finally:
        front.stop()
        proxy.close()
    queued = [i for key in connection.keys("rq:queue:*") for i in connection.lrange(key, 0, -1)]
    assert queued == [job_id]


def _upload_until_killed(url: str) -> None:
    with contextlib.suppress(httpx.TransportError):
        httpx.post(
            url + "/v1/audio/voices",
            data={"name": "alice", "transcript": "Hello."},
            files={"file": ("alice.wav", tone_wav(), "audio/wav")},
            timeout=CLAIM_TIMEOUT_S * 2,
        )


def test_a_recording_whose_front_died_before_its_job_is_deleted_by_housekeeping(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A voice upload's front killed between writing the recording and enqueueing the job that
    registers it: a worker's housekeeping deletes the recording once COSYQ_VOICE_UPLOAD_GRACE_S
    has passed (shared/voice_uploads.py), not before."""
    url = fresh_db(redis_server, "crash")
    proxy = HoldingProxy(redis_server.port)
    front = start_front(tmp_path / "front", proxy.url(DATABASES["crash"]))
    try:
        upload = functools.partial(_upload_until_killed, front.url)
        _kill_when_held(proxy, front, b"rq:job:", upload, "the front never sent its transaction")
    finally:
        front.stop()
        proxy.close()
    connection = redis.Redis.from_url(url)
    assert not connection.keys("rq:job:*")
    [recording] = (front.storage / "voices").rglob("*.wav")  # written, and nothing names it

    monkeypatch.setenv("COSYQ_REDIS_URL", url)
    monkeypatch.setenv("COSYQ_STORAGE_URL", front.storage.as_uri())
    settings = load_settings(env_file=None)
    sweep = VoiceUploadSweep(connection, settings, holder="test", storage=open_storage(settings))
    assert sweep.sweep(time.time()) == [] and recording.exists()  # within its grace: kept
    later = time.time() + settings.voice_upload_grace_s + 1
    assert sweep.sweep(later) == [recording.as_uri()]
    assert not recording.exists() and connection.zcard(VOICE_UPLOADS) == 0


@pytest.mark.parametrize("refused", [0, 6], ids=["back_at_once", "away_a_moment"])
def test_a_cancel_whose_exec_answer_is_lost_says_canceled(
    redis_server: RedisServer, tmp_path: Path, refused: int
) -> None:
    """Redis applies the cancel's transaction and the connection drops before its answer,
    then (`away_a_moment`) refuses the front's next connections: the cancel reads the job back
    with its own token and says `canceled` (it said `already_canceled`, or failed, for what it
    did itself); its event is told once, and a second cancel says `already_canceled`."""
    url = fresh_db(redis_server, "crash")
    connection = redis.Redis.from_url(url, decode_responses=True)
    job_id = queued_job(connection, {"text": "Never.", "webhook": {"url": RECEIVER + "x"}})
    proxy = HoldingProxy(redis_server.port)
    hooks = {"COSYQ_WEBHOOK_ALLOWED_URLS": RECEIVER, "COSYQ_WEBHOOK_ALLOW_PRIVATE": "true"}
    front = start_front(tmp_path / "front", proxy.url(DATABASES["crash"]), **hooks)
    try:
        proxy.cut_next_exec(keys.CANCELED_BY_FIELD.encode(), refuse=refused)
        with front.http(None) as http:
            answer = http.delete(f"/v1/jobs/{job_id}")
            assert proxy.held.is_set()
            assert answer.status_code == 200, answer.text
            assert answer.json()["result"] == "canceled", answer.text
            again = http.delete(f"/v1/jobs/{job_id}")
            assert again.json()["result"] == "already_canceled", again.text
    finally:
        front.stop()
        proxy.close()
    events = [f["event"] for _, f in connection.xrange(WEBHOOK_OUTBOX) if f["job_id"] == job_id]
    assert events == ["job.canceled"]


def test_a_cancel_retried_after_a_503_with_its_idempotency_key_says_canceled(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    """The cancel's transaction applies, its answer is lost and Redis stays away past
    COSYQ_CANCEL_LOST_ANSWER_WAIT_S: the caller gets 503 and retries. With the first try's
    Idempotency-Key the retry gets the first's body (`canceled`; it said `already_canceled` for
    its own cancel); without it, or with another key, `already_canceled`; one event."""
    url = fresh_db(redis_server, "crash")
    connection = redis.Redis.from_url(url, decode_responses=True)
    job_id = queued_job(connection, {"text": "Never.", "webhook": {"url": RECEIVER + "x"}})
    proxy = HoldingProxy(redis_server.port)
    hooks = {"COSYQ_WEBHOOK_ALLOWED_URLS": RECEIVER, "COSYQ_WEBHOOK_ALLOW_PRIVATE": "true"}
    away = {"COSYQ_CANCEL_LOST_ANSWER_WAIT_S": "0.5", **hooks}
    front = start_front(tmp_path / "front", proxy.url(DATABASES["crash"]), **away)
    mine = {"Idempotency-Key": "stop-chapter-1"}
    try:
        proxy.cut_next_exec(keys.CANCELED_BY_FIELD.encode(), refuse=1_000_000)
        with front.http(None) as http:
            lost = http.delete(f"/v1/jobs/{job_id}", headers=mine)
            assert proxy.held.is_set()
            assert lost.status_code == 503, lost.text
            proxy.accept_again()
            retry = http.delete(f"/v1/jobs/{job_id}", headers=mine)
            assert retry.status_code == 200, retry.text
            assert retry.json() == {
                "id": job_id,
                "result": "canceled",
                "state": "queued",
                "message": f"job {job_id} canceled (it was queued; it will not run)",
            }
            assert http.delete(f"/v1/jobs/{job_id}", headers=mine).json() == retry.json()
            other = http.delete(f"/v1/jobs/{job_id}", headers={"Idempotency-Key": "another"})
            assert other.json()["result"] == "already_canceled", other.text
            bare = http.delete(f"/v1/jobs/{job_id}")
            assert bare.json()["result"] == "already_canceled", bare.text
    finally:
        front.stop()
        proxy.close()
    events = [f["event"] for _, f in connection.xrange(WEBHOOK_OUTBOX) if f["job_id"] == job_id]
    assert events == ["job.canceled"]
