"""The assembly step alone (no model, real Redis, file storage): two assemblers racing write the
file once, and one that died holding the claim is finished by the next once the claim lapses."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import redis
import soundfile as sf

from shared.document_state import DocumentResult, document_key
from shared.settings import Settings, load_settings
from shared.storage import FileStorage, StoredObject
from workers.documents.job import assemble
from workers.tools.bench.document import synthetic_document


class CountingStorage(FileStorage):
    """File storage that counts the assembled files written."""

    def __init__(self, settings: Settings, root: Path) -> None:
        super().__init__(settings, root)
        self.files = 0
        self.lock = threading.Lock()

    def put_file(self, key: str, path: Path, content_type: str, metadata: Any) -> StoredObject:
        with self.lock:
            self.files += 1
        return super().put_file(key, path, content_type, metadata)


def setup(redis_url: str, tmp_path: Path) -> tuple[redis.Redis, CountingStorage, Settings]:
    settings = load_settings(
        env_file=None,
        redis_url=redis_url,
        storage_url=(tmp_path / "out").as_uri(),
        document_claim_ttl_s=1.0,
        document_keep_segments=True,
    )
    return redis.Redis.from_url(redis_url), CountingStorage(settings, tmp_path / "out"), settings


def test_two_assemblers_racing_write_the_file_once(redis_url: str, tmp_path: Path) -> None:
    connection, storage, settings = setup(redis_url, tmp_path)
    document_id = synthetic_document(connection, tmp_path / "out", minutes=2)
    results: list[DocumentResult] = []

    def run(owner: str) -> None:
        results.append(assemble(connection, storage, settings, document_id, owner))

    threads = [threading.Thread(target=run, args=(f"a{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(results) == 2 and results[0] == results[1]
    assert storage.files == 1
    info = sf.info(str(tmp_path / "out" / f"documents/{document_id}/doc.mp3"))
    assert abs(info.duration - results[0].duration_s) < 0.1  # mp3 frames pad the end a little
    assert results[0].duration_s == 2 * 60.0 + 0.6


def test_an_assembler_that_died_holding_the_claim_is_finished_by_the_next(
    redis_url: str, tmp_path: Path
) -> None:
    connection, storage, settings = setup(redis_url, tmp_path)
    document_id = synthetic_document(connection, tmp_path / "out", minutes=1)
    claim = document_key(document_id, "claim")
    connection.set(claim, "dead-worker:token", px=1500)  # its heartbeat stopped
    result = assemble(connection, storage, settings, document_id, "next")
    assert result.assembler == "next" and storage.files == 1
    assert connection.get(claim) is None  # released after the write
