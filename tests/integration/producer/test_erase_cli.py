"""`cosyq erase` with real Redis and no worker: a queued job or document (canceled with an
idempotency key, or not yet) is canceled and erased at once (nothing of it left in Redis, its
keyed cancels' answers neither), a second erasure exits 4 as for an unknown id, a bad id exits
2 before anything is erased."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from producer import CosyqClient
from producer.cli import main
from tests.conftest import RedisServer
from tests.doubles.harness import Cluster, client_settings


@pytest.fixture
def own_redis_url(tmp_path: Path) -> Iterator[str]:
    """A redis-server of the test's own: the session's is shared with other files' tests, one
    of whose workers took the 'queued' job (the cancel said stopping) in a clean-clone run."""
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


def test_cosyq_erase_forgets_queued_jobs_and_documents(
    own_redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = Cluster(redis_url=own_redis_url, root=tmp_path)
    with CosyqClient(client_settings(cluster, monkeypatch)) as client:
        job_id = client.submit({"text": "Erasable queued words.", "idempotency_key": "k-1"})
        document_id = client.submit_document({"text": "Erasable document words."})
        # canceled with a key first: its answers kept for a retry go with the erasure
        assert client.cancel(job_id, idempotency_key="stop-1").verdict == "canceled"
        assert client.cancel_document(document_id, idempotency_key="stop-2")
        assert main(["erase", job_id]) == 0
        assert json.loads(capsys.readouterr().out) == {
            "id": job_id,
            "kind": "job",
            "deleted": [],
            "kept": [],
        }
        assert main(["erase", "--document", document_id]) == 0
        assert json.loads(capsys.readouterr().out)["kind"] == "document"
        names = [raw.decode() for raw in client.connection.scan_iter(count=1000)]
        assert [n for n in names if job_id in n or document_id in n] == []
        for raw in client.connection.scan_iter(count=1000):
            if client.connection.type(raw) == b"string":
                assert b"Erasable" not in (client.connection.get(raw) or b"")
        assert main(["erase", job_id]) == 4  # erased: as an id never made
        assert main(["erase", "--document", document_id]) == 4
        assert main(["erase", "../x", job_id]) == 2
        assert client.submit({"text": "Erasable queued words.", "idempotency_key": "k-1"}) != job_id


def test_cosyq_erase_erases_any_tenants_job_as_an_operator(
    own_redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The CLI holds Redis and is trusted as an operator (as `cosyq cancel`): a support desk
    erasing a tenant's job on its behalf must not be told there is no such job."""
    monkeypatch.setenv("COSYQ_TENANTS", "billing")
    cluster = Cluster(redis_url=own_redis_url, root=tmp_path)
    settings = client_settings(cluster, monkeypatch)
    with CosyqClient(settings, tenant="billing") as billing:
        job_id = billing.submit({"text": "Erasable billing words."})
        document_id = billing.submit_document({"text": "Erasable billing document."})
        assert main(["erase", job_id]) == 0
        assert main(["erase", "--document", document_id]) == 0
        assert [json.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == [
            job_id,
            document_id,
        ]
        names = [raw.decode() for raw in billing.connection.scan_iter(count=1000)]
        assert [n for n in names if job_id in n or document_id in n] == []
