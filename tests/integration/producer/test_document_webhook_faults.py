"""Documents and webhooks under faults together, with real worker processes (the scripted test
engine), a real Redis that is stopped mid-run, real dispatcher processes (`cosyq webhooks run`)
and the real receiver: a worker SIGKILLed mid-segment and one mid-assembly, Redis away while a
document is in flight, a receiver that answers 500 and then takes a POST whose dispatcher is
SIGKILLed before booking it, and a restarted dispatcher. Whatever the timing, each document
and job ends once, every event reaches the receiver at least once under its own stable
`webhook-id`, duplicates are the same bytes, and no terminal event is lost."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from standardwebhooks.webhooks import Webhook

from producer import CosyqClient
from producer.webhooks.store import WebhookStore
from shared.keys import QUEUES_IN_PRIORITY_ORDER
from tests.doubles.harness import Cluster, client_settings, pool_of_two, wait_for
from tests.doubles.webhook_receiver import Receiver
from tests.integration.producer.webhook_rig import (  # noqa: F401 (fixtures used by name)
    SECRET,
    receiver_fixture,
)
from workers.tools.local_redis import LocalRedis

TERMINAL = {"job.finished", "job.failed", "job.canceled", "document.finished", "document.failed"}


def overrides(receiver: Receiver) -> dict[str, str]:
    return {
        "COSYQ_DOCUMENT_SEGMENT_CHARS": "100",
        "COSYQ_DOCUMENT_ASSEMBLY_GRACE_S": "1",
        "COSYQ_DOCUMENT_CLAIM_TTL_S": "2",  # a dead assembler's claim lapses soon
        "COSYQ_WEBHOOK_SECRET": SECRET,
        "COSYQ_WEBHOOK_ALLOWED_URLS": receiver.url,
        "COSYQ_WEBHOOK_ALLOW_PRIVATE": "1",  # the receiver is on loopback
        "COSYQ_WEBHOOK_BACKOFF_S": "0.2",
        "COSYQ_WEBHOOK_TIMEOUT_S": "1",
        "COSYQ_WEBHOOK_CLAIM_IDLE_S": "1.5",  # a dead dispatcher's entries taken over soon
        "COSYQ_WEBHOOK_POLL_S": "0.1",
    }


def dispatcher(cluster: Cluster, name: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "producer.cli", "webhooks", "run"]
    return cluster.spawn(command, f"{name}.log")


def by_id(receiver: Receiver) -> dict[str, list[str]]:
    """Each webhook-id the receiver got, with the bodies of its deliveries."""
    seen: dict[str, list[str]] = defaultdict(list)
    for call in list(receiver.calls):
        seen[call.headers["webhook-id"]].append(call.body)
    return seen


def assert_told_once_each(receiver: Receiver, subjects: list[str]) -> dict[str, dict]:
    """Every delivery verifies, duplicates are byte for byte the same under one id, and each
    subject (job or document) has exactly one terminal outcome told; its body by subject."""
    told: dict[str, list[tuple[str, dict]]] = defaultdict(list)
    for webhook_id, bodies in by_id(receiver).items():
        assert len(set(bodies)) == 1, webhook_id  # a duplicate is the same event
        call = next(c for c in receiver.calls if c.headers["webhook-id"] == webhook_id)
        body = Webhook(SECRET).verify(call.body, call.headers)
        subject = body.get("document_id") or body["job_id"]
        told[subject].append((webhook_id, body))
    for subject in subjects:
        outcomes = [b.get("event", "job." + b["state"]) for _, b in told[subject]]
        assert len([o for o in outcomes if o in TERMINAL]) == 1, (subject, outcomes)
    return {s: told[s][0][1] for s in subjects}


@pytest.fixture
def marks() -> Iterator[Path]:
    """A short folder for `once:` markers (a segment is 100 characters)."""
    folder = Path(tempfile.mkdtemp(prefix="cq"))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(120)
def test_a_document_and_its_jobs_finish_and_are_told_once_through_every_fault(
    tmp_path: Path, receiver: Receiver, marks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed mid-segment (and mid-job), Redis stopped while the document is in
    flight, the receiver's 500, and a dispatcher killed after its POST reached the receiver
    but before it booked it, then a new dispatcher: everything ends, once, and is told."""
    server = LocalRedis(tmp_path / "redis", persistent=True)
    server.start()
    text = "\n\n".join(
        [
            "The first paragraph is short.",
            f"The second is killed once:{marks}/a kill here.",
            "The third one waits a little sleep:0.5 then ends.",
            "The last paragraph closes the document.",
        ]
    )
    killed = threading.Event()
    processes: list[subprocess.Popen[bytes]] = []

    def kill_dispatcher_once() -> None:  # the POST reached the receiver; its sender dies
        if receiver.calls and not killed.is_set():  # the second POST: the 500 was the first
            killed.set()
            processes[0].send_signal(signal.SIGKILL)
            processes[0].wait(timeout=10)

    try:
        with (
            pool_of_two(server.url, tmp_path, overrides(receiver)) as cluster,
            CosyqClient(client_settings(cluster, monkeypatch)) as client,
        ):
            hook = {"url": receiver.url + "doc"}
            document_id = client.submit_document({"text": text, "webhook": hook})
            jobs = [
                client.submit({"text": f"A job killed once:{marks}/b kill.", "webhook": hook}),
                client.submit({"text": "A plain job.", "webhook": hook}),
            ]
            wait_for(lambda: client.document_status(document_id).done >= 1, 60, "a segment")
            server.stop()  # Redis away while the document is in flight
            time.sleep(1)
            server.start()
            receiver.answers = [500]
            receiver.on_post = kill_dispatcher_once
            processes.append(dispatcher(cluster, "dispatcher-1"))
            result = client.document_result(document_id, timeout=60)
            wait_for(killed.is_set, 30, "a POST whose dispatcher was killed")
            processes.append(dispatcher(cluster, "dispatcher-2"))
            store = WebhookStore(client.connection)
            wait_for(lambda: len(by_id(receiver)) == 3, 30, "every event delivered")
            wait_for(lambda: store.counts() == (0, 0), 30, "the outbox empty, none dead")
            assert client.connection.ping()  # Redis came back (its data kept)
            for process in processes[1:]:
                process.send_signal(signal.SIGTERM)
                assert process.wait(timeout=30) == 0
    finally:
        server.stop()
    assert (marks / "a").exists() and (marks / "b").exists()  # both workers were killed
    assert max(len(bodies) for bodies in by_id(receiver).values()) >= 2  # the unbooked POST
    told = assert_told_once_each(receiver, [document_id, *jobs])
    assert told[document_id]["event"] == "document.finished"
    assert told[document_id]["result"]["uri"] == result.uri
    assert [told[j]["state"] for j in jobs] == ["finished", "finished"]
    assert Path(unquote(urlsplit(result.uri).path)).stat().st_size > 0
    assert result.segments == 4


@pytest.mark.timeout(120)
def test_a_worker_killed_mid_assembly_leaves_a_document_that_finishes_told_once(
    tmp_path: Path, redis_url: str, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The assembler dies under its claim with the file half written: the reaper retries the
    assembly job, the next assembler takes the claim once it lapses and writes the whole file,
    and the document's one `document.finished` is told once."""
    cluster = Cluster(redis_url=redis_url, root=tmp_path, overrides=overrides(receiver))
    try:
        with CosyqClient(client_settings(cluster, monkeypatch)) as client:
            text = "One paragraph here.\n\nAnother one there.\n\nA third to close it."
            hook = {"url": receiver.url + "doc"}
            document_id = client.submit_document({"text": text, "webhook": hook})
            command = [sys.executable, "-m", "rq.cli", "worker", "--url", redis_url]
            command += ["-w", "tests.doubles.racy_workers.KilledMidAssembly"]
            command += ["-S", "rq.serializers.JSONSerializer", *QUEUES_IN_PRIORITY_ORDER]
            killed = cluster.spawn(command, "killed.log")
            assert killed.wait(timeout=60) == -signal.SIGKILL
            assert client.document_status(document_id).state == "assembling"
            cluster.start("run", log_name="after.log")
            result = client.document_result(document_id, timeout=60)
            processes = [dispatcher(cluster, "dispatcher")]
            wait_for(lambda: receiver.calls, 30, "the document's event")
            store = WebhookStore(client.connection)
            wait_for(lambda: store.counts() == (0, 0), 30, "the outbox empty, none dead")
            processes[0].send_signal(signal.SIGTERM)
            assert processes[0].wait(timeout=30) == 0
    finally:
        cluster.stop_all()
    told = assert_told_once_each(receiver, [document_id])
    assert told[document_id]["result"]["sha256"] == result.sha256
    assert result.segments >= 2 and Path(unquote(urlsplit(result.uri).path)).stat().st_size > 0
    assert len(receiver.calls) == 1
