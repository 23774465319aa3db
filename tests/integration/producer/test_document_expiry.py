"""A document that ends unassembled (a segment refused for good, or canceled) with the scripted
test engine, real Redis and real worker processes: its done segments' audio stays while it can
be retried, and is deleted by the workers once its plan has expired (COSYQ_RESULT_TTL_S after
its last progress), with nothing of the document left in storage but what it published."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rq import Worker

from producer import CosyqClient
from producer.cli import main
from shared.document_state import (
    SEGMENT_EXPIRY_LOCK,
    SEGMENT_RECORDS,
    SEGMENTS_DUE,
    document_key,
    job_ids,
)
from shared.documents import segment_key
from shared.storage import open_storage
from tests.doubles.harness import Cluster, client_settings, pool_of_two, wait_for
from tests.integration.producer.test_document_faults import fail
from workers.documents.expiry import ExpiredSegments

PARAGRAPH = (
    "The first sentence is short. The second one says a little more, and then it stops. "
    "A third sentence ends the paragraph, or would, but a fourth comes after it."
)
TTL_S = 8  # the plan's TTL from the last progress (the keepalive renews it while jobs wait)


@pytest.fixture
def short_marker() -> Iterator[Path]:
    """A `refuse:` marker path short enough for one segment of 100 characters."""
    folder = Path(tempfile.mkdtemp(prefix="cq"))
    try:
        yield folder / "m"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("ending", ["failed", "canceled"])
def test_an_unassembled_documents_segments_are_deleted_once_it_expires(
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    short_marker: Path,
    ending: str,
) -> None:
    """Whichever way it ends (a cancel may come after every segment is done: then it is
    assembled, and its assembler deletes them), no segment audio is left once the plan is
    gone, and no record of it either."""
    if ending == "failed":
        last = [f"Then refuse:{short_marker} happens."]
    else:  # slow ones: two run while the cancel comes, the rest still wait
        last = [f"Then sleep:5 happens {n}." for n in range(4)]
    text = "\n\n".join([PARAGRAPH, PARAGRAPH, *last])
    overrides = {"COSYQ_DOCUMENT_SEGMENT_CHARS": "100", "COSYQ_RESULT_TTL_S": str(TTL_S)}
    with (
        pool_of_two(redis_url, tmp_path, overrides) as cluster,
        CosyqClient(client_settings(cluster, monkeypatch)) as client,
    ):
        # no worker, no keepalive: on a loaded machine the pool could start after the plan's
        # TTL, and the plan expired before any segment ran
        wait_for(lambda: bool(Worker.all(connection=client.connection)), 120, "a worker")
        document_id = client.submit_document({"text": text})
        folder = cluster.root / "out" / "documents" / document_id / "segments"
        if ending == "failed":
            wait_for(lambda: client.document_status(document_id).state == "failed", 120, "it")
        else:
            wait_for(lambda: client.document_status(document_id).done >= 1, 120, "a segment")
            client.cancel_document(document_id)
        wait_for(lambda: client.document_status(document_id).running == 0, 60, "the rest")
        assert client.document_status(document_id).done >= 1
        connection = client.connection
        wait_for(lambda: not connection.exists(document_key(document_id)), 60, "the plan gone")
        wait_for(lambda: not folder.exists() or not any(folder.iterdir()), 60, "audio deleted")
        wait_for(lambda: connection.hget(SEGMENT_RECORDS, document_id) is None, 10, "no record")


def test_a_retried_document_from_before_records_gets_one(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A document submitted before its segments had a record (none in Redis) gets one when
    it is retried, due at the plan's renewed expiry (no worker runs here)."""
    cluster = Cluster(redis_url=redis_url, root=tmp_path)
    with CosyqClient(client_settings(cluster, monkeypatch)) as client:
        connection = client.connection
        document_id = client.submit_document({"text": PARAGRAPH})
        segments = len(job_ids(connection, document_id))
        connection.hdel(SEGMENT_RECORDS, document_id)  # as one from before records has none
        connection.zrem(SEGMENTS_DUE, document_id)
        fail(connection, job_ids(connection, document_id)[0])
        assert client.retry_document(document_id) == [0]
        record = json.loads(connection.hget(SEGMENT_RECORDS, document_id) or "{}")
        due = connection.zscore(SEGMENTS_DUE, document_id) or 0.0
        left = connection.ttl(document_key(document_id))
    assert record == {"tenant": "default", "segments": segments}
    assert abs(due - (time.time() + left)) < 5  # looked at when the renewed plan expires


def test_backfill_records_the_documents_from_before_records_so_their_audio_goes(
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`cosyq document backfill-records` writes the record of a live plan written the old way
    (none in Redis), due at the plan's expiry, and nothing else: once the plan is gone the
    expiry duty deletes that document's segment audio (no worker runs here: the duty is
    ticked by the test)."""
    cluster = Cluster(redis_url=redis_url, root=tmp_path)
    settings = client_settings(cluster, monkeypatch)
    storage = open_storage(settings)
    with CosyqClient(settings) as client:
        connection = client.connection
        old, new = (client.submit_document({"text": text}) for text in (PARAGRAPH, "New one."))
        connection.hdel(SEGMENT_RECORDS, old)  # as a plan from before records: none
        connection.zrem(SEGMENTS_DUE, old)
        new_record = connection.hget(SEGMENT_RECORDS, new)
        done = storage.put(segment_key(old, 0), b"RIFF a done segment", "audio/wav", {})
        audio = Path(done.uri.removeprefix("file://"))  # the default tenant's: no prefix
        assert main(["document", "backfill-records"]) == 0
        captured = capsys.readouterr()
        assert captured.out.split() == [old]
        assert "wrote the segments' record of 1 document" in captured.err
        record = json.loads(connection.hget(SEGMENT_RECORDS, old) or "{}")
        assert record == {"tenant": "default", "segments": len(job_ids(connection, old))}
        due = connection.zscore(SEGMENTS_DUE, old) or 0.0
        assert abs(due - (time.time() + connection.ttl(document_key(old)))) < 5
        assert connection.hget(SEGMENT_RECORDS, new) == new_record  # its own is left as it was
        assert main(["document", "backfill-records"]) == 0  # a second walk finds none lacking
        assert capsys.readouterr().out.split() == []

        duty = ExpiredSegments(connection, settings, holder="test", storage=storage)
        assert duty.tick() == [] and audio.exists()  # not due yet
        connection.delete(document_key(old))  # the plan expires
        connection.zadd(SEGMENTS_DUE, {old: time.time() - 1})
        connection.delete(SEGMENT_EXPIRY_LOCK)  # the next tick
        assert duty.tick() == [old]
        assert not audio.exists()
        assert connection.hget(SEGMENT_RECORDS, old) is None
