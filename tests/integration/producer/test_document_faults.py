"""Documents under faults (issue 45, items 2-4), with the scripted test engine, real Redis and
real worker processes: a worker killed between the script that records the last segment and
the assembly job's enqueue, an assembly that failed, retried once over HTTP, and the document's
own webhook events (failed, then finished after a retry; canceled) in place of its segments'."""

from __future__ import annotations

import json
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import redis
from rq import Queue, Worker
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer
from standardwebhooks.webhooks import Webhook

from producer import CosyqClient
from producer.webhooks.dispatcher import WebhookDispatcher
from producer.webhooks.store import WebhookStore
from shared import keys
from shared.document_state import assembly_job_id, document_key, done_segments, job_ids
from shared.keys import ERROR_META_KEY, QUEUES_IN_PRIORITY_ORDER
from shared.results import SynthesisResult
from shared.settings import Settings
from tests.doubles.harness import Cluster, client_settings, pool_of_two, wait_for
from tests.doubles.webhook_receiver import Receiver, webhook_receiver
from tests.integration.producer.webhook_rig import SECRET

PARAGRAPH = (
    "The first sentence is short. The second one says a little more, and then it stops. "
    "A third sentence ends the paragraph, or would, but a fourth comes after it."
)


def outbox(connection: redis.Redis) -> list[dict[str, str]]:
    entries = connection.xrange(keys.WEBHOOK_OUTBOX)
    return [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]


def deliver(connection: redis.Redis, settings: Settings, receiver: Receiver, count: int) -> None:
    """Run a dispatcher until the receiver has `count` calls and the outbox is empty."""
    settings = settings.model_copy(update={"webhook_allow_private": True})
    stop = threading.Event()
    dispatcher = WebhookDispatcher(connection, settings)
    thread = threading.Thread(target=dispatcher.run, args=(stop,))
    thread.start()
    try:
        wait_for(lambda: len(receiver.calls) == count, 30, f"{count} deliveries")
        wait_for(lambda: WebhookStore(connection).counts() == (0, 0), 10, "the outbox empty")
    finally:
        stop.set()
        thread.join(timeout=30)


def fail(connection: redis.Redis, job_id: str) -> Job:
    """A segment's job failed for good, as a worker records it (no worker runs here)."""
    job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
    job.meta[ERROR_META_KEY] = {"kind": "invalid_request", "message": "refused"}
    job.save_meta()
    job.set_status(JobStatus.FAILED)
    return job


def path_of(uri: str) -> Path:
    return Path(unquote(urlsplit(uri).path))


def state(client: CosyqClient, document_id: str) -> str:
    return client.document_status(document_id).state


@pytest.fixture
def cluster(redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """Settings for workers the test starts itself (none yet)."""
    overrides = {"COSYQ_DOCUMENT_SEGMENT_CHARS": "100", "COSYQ_DOCUMENT_ASSEMBLY_GRACE_S": "1"}
    overrides["COSYQ_WEBHOOK_ALLOW_PRIVATE"] = "1"  # the receiver is on loopback
    cluster = Cluster(redis_url=redis_url, root=tmp_path, overrides=overrides)
    try:
        yield cluster
    finally:
        cluster.stop_all()


@pytest.fixture
def settings(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Settings:
    return client_settings(cluster, monkeypatch)


@pytest.fixture
def short_marker() -> Iterator[Path]:
    """A `refuse:` marker path short enough that its sentence is one segment of 100
    characters (a pytest tmp_path under xdist is long enough to be split mid-directive)."""
    folder = Path(tempfile.mkdtemp(prefix="cq"))
    try:
        yield folder / "m"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(180)
def test_a_worker_killed_before_the_assembly_enqueue_leaves_no_document_assembling(
    cluster: Cluster, settings: Settings, redis_url: str
) -> None:
    with CosyqClient(settings) as client:
        document_id = client.submit_document({"text": PARAGRAPH})
        command = [sys.executable, "-m", "rq.cli", "worker", "--url", redis_url]
        command += ["-w", "tests.doubles.racy_workers.KilledBeforeAssembly"]
        command += ["-S", "rq.serializers.JSONSerializer", *QUEUES_IN_PRIORITY_ORDER]
        killed = cluster.spawn(command, "killed.log")
        assert killed.wait(timeout=120) == -signal.SIGKILL
        marker = assembly_job_id(client.connection, document_id)
        assert marker is not None and not Job.exists(marker, connection=client.connection)
        assert state(client, document_id) == "assembling"  # the fault: no job behind it
        cluster.start("run", log_name="after.log")
        wait_for(lambda: state(client, document_id) == "assembled", 90, "the assembly")
        result = client.document_status(document_id).result
    assert result is not None and path_of(result.uri).stat().st_size > 0


@pytest.mark.timeout(300)
def test_a_failed_assembly_needs_one_retry_over_http(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, short_marker: Path
) -> None:
    from fastapi.testclient import TestClient  # noqa: PLC0415 (cosyq[http])

    from producer.http.app import create_app  # noqa: PLC0415

    marker = short_marker
    text = f"{PARAGRAPH}\n\nThen refuse:{marker} happens."
    overrides = {"COSYQ_DOCUMENT_SEGMENT_CHARS": "100"}
    with (
        pool_of_two(redis_url, tmp_path, overrides) as cluster,
        CosyqClient(client_settings(cluster, monkeypatch)) as client,
        TestClient(create_app(client.settings)) as http,
    ):
        document_id = client.submit_document({"text": text})
        wait_for(lambda: state(client, document_id) == "failed", 120, "the refused segment")
        done = done_segments(client.connection, document_id)
        gone = min(done)
        path_of(done[gone].uri).unlink()  # its audio lost before the assembly reads it
        marker.touch()
        assert http.post(f"/v1/documents/{document_id}:retry").status_code == 202
        wait_for(lambda: state(client, document_id) == "incomplete", 120, "the assembly to fail")
        status = client.document_status(document_id)
        assert [f.index for f in status.failures] == [gone]
        retried = http.post(f"/v1/documents/{document_id}:retry")  # the one retry it needs
        assert retried.status_code == 202 and retried.json()["state"] != "failed"
        result = client.document_result(document_id, timeout=120)
        assert http.post("/v1/documents/" + "0" * 32 + ":retry").status_code == 404
    assert result.segments == status.segments


class KilledBeforeEnqueue(Exception):
    """The worker that recorded the last segment dies before it enqueues the assembly."""


def test_a_retried_document_never_reads_its_failed_assembly_as_the_next(
    cluster: Cluster, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed assembly, a retry, and the retried segment recorded but its assembly not yet
    enqueued: the document is assembling, not failed. The race a run under load lost (3 in
    60) when every assembly of a document had one job id: the next one's marker named the
    failed one's hash until its enqueue rewrote it. Here the worker's own
    `record_finished_segment` plays each segment's end, with no worker process."""
    from workers.documents import job as document_job  # noqa: PLC0415 (cosyq[worker])

    def finish(connection: redis.Redis, document_id: str, index: int) -> None:
        job_id = job_ids(connection, document_id)[index]
        Job.fetch(job_id, connection=connection, serializer=JSONSerializer).set_status(
            JobStatus.FINISHED
        )
        result = SynthesisResult.model_construct(
            job_id=job_id, uri=f"file:///gone/{index}.wav", duration_s=0.5, attempt=1
        )
        document_job.record_finished_segment(connection, settings, (document_id, index), result)

    with CosyqClient(settings) as client:
        connection = client.connection
        document_id = client.submit_document({"text": PARAGRAPH})
        for index in sorted(job_ids(connection, document_id)):
            finish(connection, document_id, index)
        failed = assembly_job_id(connection, document_id)
        assert failed is not None
        # the assembler found segment 0's audio gone: it forgets the segment and fails
        connection.hdel(document_key(document_id, "done"), "0")
        assembly = Job.fetch(failed, connection=connection, serializer=JSONSerializer)
        assembly.meta[ERROR_META_KEY] = {"kind": "invalid_request", "message": "audio gone"}
        assembly.save_meta()
        assembly.set_status(JobStatus.FAILED)
        assert state(client, document_id) == "incomplete"
        assert client.retry_document(document_id) == [0]

        def killed(*args: object, **kwargs: object) -> None:
            raise KilledBeforeEnqueue

        monkeypatch.setattr(document_job, "enqueue_assembly", killed)
        with pytest.raises(KilledBeforeEnqueue):
            finish(connection, document_id, 0)
        status = client.document_status(document_id)
        marker = assembly_job_id(connection, document_id)
    assert (status.state, status.failures) == ("assembling", [])
    assert marker is not None and marker != failed


@pytest.mark.timeout(300)
def test_a_document_tells_its_webhook_of_its_ends_never_of_its_segments(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, short_marker: Path
) -> None:
    marker = short_marker
    text = f"{PARAGRAPH}\n\nThen refuse:{marker} happens."
    with webhook_receiver() as receiver:
        overrides = {"COSYQ_DOCUMENT_SEGMENT_CHARS": "100", "COSYQ_WEBHOOK_SECRET": SECRET}
        overrides["COSYQ_WEBHOOK_ALLOWED_URLS"] = receiver.url
        overrides["COSYQ_WEBHOOK_ALLOW_PRIVATE"] = "1"  # the receiver is on loopback
        with (
            pool_of_two(redis_url, tmp_path, overrides) as cluster,
            CosyqClient(client_settings(cluster, monkeypatch)) as client,
        ):
            hook = {"url": receiver.url + "book"}
            document_id = client.submit_document({"text": text, "webhook": hook})
            wait_for(lambda: state(client, document_id) == "failed", 120, "the refused segment")
            wait_for(lambda: client.document_status(document_id).running == 0, 60, "the rest")
            marker.touch()
            client.retry_document(document_id)
            result = client.document_result(document_id, timeout=120)
            events = outbox(client.connection)
            deliver(client.connection, client.settings, receiver, 2)
    assert [(e["event"], e["job_id"]) for e in events] == [
        ("document.failed", document_id),
        ("document.finished", document_id),
    ]  # not one job.finished per segment
    assert len({e["webhook_id"] for e in events}) == 2
    bodies = [Webhook(SECRET).verify(call.body, call.headers) for call in receiver.calls]
    assert all(call.path == "/hooks/book" for call in receiver.calls)
    failed, finished = sorted(bodies, key=lambda b: b["event"])
    assert failed["state"] == "failed" and failed["segment"] == client_index(failed)
    assert finished["state"] == "assembled" and finished["document_id"] == document_id
    told = finished["result"]
    assert (told["uri"], told["manifest_uri"]) == (result.uri, result.manifest_uri)
    assert (told["srt_uri"], told["vtt_uri"]) == (result.srt_uri, result.vtt_uri)
    assert occurred(failed) < occurred(finished)  # a receiver orders a document's events so


def occurred(body: dict[str, object]) -> datetime:
    """The event's `occurred_at`, ISO 8601 in UTC as every time the API shows."""
    moment = datetime.fromisoformat(str(body["occurred_at"]))
    assert moment.utcoffset() == timedelta(0)
    return moment


def client_index(body: dict[str, object]) -> object:
    """The failed segment the body names: the last one (its text carries the refusal)."""
    assert isinstance(body["segment"], int) and body["job_id"]
    return body["segment"]


def test_a_canceled_document_is_told_once(cluster: Cluster, settings: Settings) -> None:
    url = "http://127.0.0.1:9/hooks/"
    allowed = settings.model_copy(update={"webhook_allowed_urls": url})
    with CosyqClient(allowed) as client:
        text = "\n\n".join([PARAGRAPH] * 4)
        document_id = client.submit_document({"text": text, "webhook": {"url": url}})
        outcomes = client.cancel_document(document_id)  # no worker runs: each one canceled
        again = client.cancel_document(document_id)
        events = outbox(client.connection)
        assert state(client, document_id) == "canceled"
    assert len(outcomes) > 1 and {o.verdict for o in outcomes.values()} == {"canceled"}
    assert {o.verdict for o in again.values()} == {"already_canceled"}
    assert [(e["event"], e["job_id"]) for e in events] == [("document.canceled", document_id)]
    assert occurred(json.loads(events[0]["body"])) <= datetime.now(UTC)


def test_a_superseded_segment_job_ending_tells_nothing(
    cluster: Cluster, settings: Settings
) -> None:
    """A segment's job that a retry replaced (two retries at once: the first one's job is
    superseded by the second's) ends failed: that is not the document's end. Told, it would
    send a false `document.failed` and its guard would silence the `document.finished` of the
    job that does count. The current job's failure is still told."""
    from shared.job_events import WebhookPolicy, job_ended  # noqa: PLC0415

    url = "http://127.0.0.1:9/hooks/"
    allowed = settings.model_copy(update={"webhook_allowed_urls": url})
    policy = WebhookPolicy.from_settings(allowed)

    with CosyqClient(allowed) as client:
        connection = client.connection
        document_id = client.submit_document({"text": PARAGRAPH, "webhook": {"url": url}})
        old = fail(connection, job_ids(connection, document_id)[0])
        assert client.retry_document(document_id) == [0]  # segment 0 now has a new job
        job_ended(connection, old, "job.failed", policy)  # the superseded job's end
        superseded = outbox(connection)
        current = fail(connection, job_ids(connection, document_id)[0])
        job_ended(connection, current, "job.failed", policy)
        told = outbox(connection)
    assert superseded == []
    assert [(e["event"], e["job_id"]) for e in told] == [("document.failed", document_id)]
    assert json.loads(told[0]["body"])["job_id"] == current.id


def test_two_retries_at_once_redo_a_failed_segment_once(
    cluster: Cluster, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second retry runs between the first one's read of the status and its write: one
    of the two redoes the segment, with one new job; the other redoes nothing."""
    from producer import documents  # noqa: PLC0415

    read_status, inner = documents.document_status, []

    def raced(client: CosyqClient, document_id: str) -> documents.DocumentStatus:
        status = read_status(client, document_id)
        if not inner:
            inner.append(None)
            inner.append(documents.retry_document(client, document_id))
        return status

    with CosyqClient(settings) as client:
        connection = client.connection
        document_id = client.submit_document({"text": PARAGRAPH})
        failed = fail(connection, job_ids(connection, document_id)[0]).id
        monkeypatch.setattr(documents, "document_status", raced)
        outer = client.retry_document(document_id)
        current = job_ids(connection, document_id)[0]
        queued = client.queue_for("default")
        waiting = Queue(queued, connection=connection, serializer=JSONSerializer).get_jobs()
    assert sorted([*inner[1], *outer]) == [0]
    redone = [
        job.id
        for job in waiting
        if job.meta.get("cosyq_document", {}).get("index") == 0 and job.id != failed
    ]
    assert redone == [current]  # one new job for segment 0, the one its document counts on


@pytest.mark.timeout(120)
def test_a_document_running_longer_than_the_result_ttl_still_finishes(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state's TTL (COSYQ_RESULT_TTL_S) counts from the document's last progress, not from
    its submit: a document whose segments take longer in all than the TTL (a long book on a
    small fleet, 24 h by default) is assembled, not forgotten with its plan mid-way."""
    cluster.overrides["COSYQ_RESULT_TTL_S"] = "5"
    settings = client_settings(cluster, monkeypatch)
    part = "Part {} of the story goes on for a while here, sleep:2 and then it ends."
    text = "\n\n".join(part.format(n) for n in ("one", "two", "three", "four"))
    with CosyqClient(settings) as client:
        cluster.start("run", log_name="w.log")  # one worker: the segments one after another
        ready = lambda: bool(Worker.all(connection=client.connection))  # noqa: E731
        wait_for(ready, 60, "the worker")
        document_id = client.submit_document({"text": text})
        assert len(job_ids(client.connection, document_id)) == 4  # each 2 s: 8 s in all
        result = client.document_result(document_id, timeout=60)
    assert result.segments == 4


@pytest.mark.timeout(120)
def test_a_document_waiting_in_a_queue_longer_than_the_result_ttl_still_finishes(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A document whose segments all wait in a deep queue longer than the TTL before any of
    them starts (the one worker busy with a long job ahead of them) keeps its plan: the
    workers' housekeeping keeps a document with a job still waiting or running alive."""
    cluster.overrides["COSYQ_RESULT_TTL_S"] = "3"
    settings = client_settings(cluster, monkeypatch)
    with CosyqClient(settings) as client:
        connection = client.connection
        cluster.start("run", log_name="w.log")  # one worker
        wait_for(lambda: bool(Worker.all(connection=connection)), 60, "the worker")
        ahead = client.submit({"text": "A long job ahead of the document. sleep:9"})
        started = lambda: client.status(ahead).state == "started"  # noqa: E731
        wait_for(started, 30, "the job ahead started")
        document_id = client.submit_document({"text": PARAGRAPH})
        result = client.document_result(document_id, timeout=60)
    assert result.segments == len(job_ids(connection, document_id))


@pytest.mark.timeout(120)
def test_a_segment_whose_document_expired_before_it_ran_fails_clearly(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No worker at all for longer than the TTL: the plan is gone when a segment's job
    starts, and the job fails as an invalid request naming the expired document (it does not
    synthesize audio nobody will assemble and finish as if all were well)."""
    cluster.overrides["COSYQ_RESULT_TTL_S"] = "2"
    settings = client_settings(cluster, monkeypatch)
    with CosyqClient(settings) as client:
        connection = client.connection
        document_id = client.submit_document({"text": PARAGRAPH})
        segment_jobs = list(job_ids(connection, document_id).values())
        gone = lambda: not connection.exists(document_key(document_id))  # noqa: E731
        wait_for(gone, 30, "the plan expired")
        cluster.start("run", log_name="w.log")
        failed = lambda: all(client.status(j).state == "failed" for j in segment_jobs)  # noqa: E731
        wait_for(failed, 60, "every segment's job failed")
        errors = [
            Job.fetch(j, connection=connection, serializer=JSONSerializer).meta[ERROR_META_KEY]
            for j in segment_jobs
        ]
    assert {e["kind"] for e in errors} == {"invalid_request"}
    assert all(f"document {document_id}" in e["message"] for e in errors)
    assert all("expired" in e["message"] for e in errors)


def test_a_segment_recorded_done_whose_job_then_fails_tells_nothing(
    cluster: Cluster, settings: Settings
) -> None:
    """The worker recorded the segment's audio and died before RQ recorded the job finished;
    the reaper, no retry left, fails the job. The segment is done and the document goes on to
    be assembled: a `document.failed` now would be false, and its guard would silence the
    `document.finished` to come."""
    from shared.job_events import WebhookPolicy, job_ended  # noqa: PLC0415
    from workers.documents import job as document_job  # noqa: PLC0415 (cosyq[worker])

    url = "http://127.0.0.1:9/hooks/"
    allowed = settings.model_copy(update={"webhook_allowed_urls": url})
    with CosyqClient(allowed) as client:
        connection = client.connection
        document_id = client.submit_document({"text": PARAGRAPH, "webhook": {"url": url}})
        job_id = job_ids(connection, document_id)[0]
        result = SynthesisResult.model_construct(
            job_id=job_id, uri="file:///kept/0.wav", duration_s=0.5, attempt=1
        )
        document_job.record_finished_segment(connection, allowed, (document_id, 0), result)
        job_ended(
            connection, fail(connection, job_id), "job.failed", WebhookPolicy.from_settings(allowed)
        )
        assert 0 in done_segments(connection, document_id)
        told = outbox(connection)
    assert told == []
