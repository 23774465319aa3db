"""`cosyq document backfill-records` gives a document assembled before outputs' records existed
its record (producer/output_records.py), so its file, manifest and captions go once its result
expires, as COSYQ_AUDIO_RETENTION says; with real Redis and the files written the old way (no
note beside them), the expiry duty ticked by the test."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from producer import CosyqClient
from producer.cli import main
from shared.document_outputs import OUTPUT_RECORDS, OUTPUTS_DUE
from shared.document_state import document_key
from shared.documents import document_folder
from shared.storage import open_storage
from tests.doubles.harness import Cluster, client_settings
from workers.documents.outputs_expiry import ExpiredOutputs

EXTS = ("wav", "json", "srt", "vtt")


def test_backfill_records_the_outputs_of_documents_assembled_before_records(
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = Cluster(redis_url=redis_url, root=tmp_path)
    settings = client_settings(cluster, monkeypatch)
    storage = open_storage(settings)
    with CosyqClient(settings) as client:
        connection = client.connection
        own = client.submit_document({"text": "Its own folder."})
        named = client.submit_document({"text": "A named file.", "output_key": "books/ch1"})
        waiting = client.submit_document({"text": "Not assembled yet."})
        stems = {own: document_folder(own) + own, named: "books/ch1"}
        for document_id, stem in stems.items():  # assembled by a worker from before records
            connection.set(document_key(document_id, "result"), "{}", ex=600)
            for ext in EXTS:
                storage.put(f"{stem}.{ext}", b"old", "application/octet-stream", {})
        assert main(["document", "backfill-records"]) == 0
        captured = capsys.readouterr()
        assert own in captured.out.split() and named not in captured.out.split()
        assert waiting not in captured.out.split()  # not assembled: not its record
        assert "the outputs' record of 1 assembled document" in captured.err
        # the caller's output_key under `unnamed` (the default): nothing of it to delete
        assert connection.hkeys(OUTPUT_RECORDS) == [own.encode()]
        record = json.loads(connection.hget(OUTPUT_RECORDS, own) or "{}")
        assert record == {
            "tenant": "default",
            "output_key": stems[own],
            "format": "wav",
            "kept_segments": 0,
        }
        due = connection.zscore(OUTPUTS_DUE, own) or 0.0
        assert abs(due - (time.time() + 600)) < 5  # at the result's own expiry
        assert main(["document", "backfill-records"]) == 0  # a second walk finds none lacking
        assert "the outputs' record of 0 assembled documents" in capsys.readouterr().err

        duty = ExpiredOutputs(connection, settings, holder="test", storage=storage)
        for document_id in (own, named):  # both expire
            connection.delete(document_key(document_id), document_key(document_id, "result"))
        connection.zadd(OUTPUTS_DUE, {own: 0})
        assert duty.tick() == [own]
    root = Path(settings.storage_url.removeprefix("file://"))
    assert not (root / document_folder(own)).exists()  # its own folder: every file, then it
    assert sorted(p.name for p in (root / "books").iterdir()) == [f"ch1.{e}" for e in sorted(EXTS)]
    assert connection.hlen(OUTPUT_RECORDS) == 0
