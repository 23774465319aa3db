"""Documents under faults (issue 45, items 2-3), with the scripted test engine, real Redis and
real worker processes: a worker killed between the script that records the last segment and
the assembly job's enqueue, and an assembly that failed, retried once over HTTP."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from rq.job import Job

from producer import CosyqClient
from shared.document_state import assembly_job_id, done_segments
from shared.keys import QUEUES_IN_PRIORITY_ORDER
from shared.settings import Settings
from tests.doubles.harness import Cluster, client_settings, pool_of_two, wait_for

PARAGRAPH = (
    "The first sentence is short. The second one says a little more, and then it stops. "
    "A third sentence ends the paragraph, or would, but a fourth comes after it."
)


def path_of(uri: str) -> Path:
    return Path(unquote(urlsplit(uri).path))


def state(client: CosyqClient, document_id: str) -> str:
    return client.document_status(document_id).state


@pytest.fixture
def cluster(redis_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """Settings for workers the test starts itself (none yet)."""
    overrides = {"COSYQ_DOCUMENT_SEGMENT_CHARS": "100", "COSYQ_DOCUMENT_ASSEMBLY_GRACE_S": "1"}
    cluster = Cluster(redis_url=redis_url, root=tmp_path, overrides=overrides)
    try:
        yield cluster
    finally:
        cluster.stop_all()


@pytest.fixture
def settings(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Settings:
    return client_settings(cluster, monkeypatch)


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
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient  # noqa: PLC0415 (cosyq[http])

    from producer.http.app import create_app  # noqa: PLC0415

    marker = tmp_path / "refuse-marker"
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
