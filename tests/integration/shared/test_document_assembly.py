"""The assembly step alone (no model, real Redis, file storage): two assemblers racing write the
file once, one that died holding the claim is finished by the next once the claim lapses, and a
plan whose keys were tampered with in Redis writes and deletes nothing; the keepalive renews a
document while a job of it waits."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import redis
import soundfile as sf
from rq import Queue

from shared.document_state import (
    LIVE_DOCUMENTS,
    DocumentPlanRecord,
    DocumentResult,
    SegmentDone,
    document_key,
    load_result,
)
from shared.errors import InvalidRequestError
from shared.settings import Settings, load_settings
from shared.storage import FileStorage, StoredObject
from workers.documents.job import assemble
from workers.documents.keepalive import DocumentKeepalive
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


def tamper(connection: redis.Redis, document_id: str, **changes: Any) -> None:
    """Rewrite the plan in Redis (what anyone who can write to Redis could do)."""
    plan = DocumentPlanRecord.model_validate_json(connection.get(document_key(document_id)) or "")
    if "segment_key" in changes:
        first = plan.segments[0].model_copy(update={"key": changes.pop("segment_key")})
        changes["segments"] = [first, *plan.segments[1:]]
    connection.set(document_key(document_id), plan.model_copy(update=changes).model_dump_json())


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"segment_key": "tenants/alpha/orders/42.wav"}, "tenants/alpha/orders/42.wav"),
        ({"segment_key": "documents/other/segments/00000.wav"}, "documents/other/segments"),
        ({"output_key": "tenants/alpha/orders/42"}, "tenants/alpha/orders/42"),
        ({"output_key": "voices/beta"}, "voices/beta"),
        ({"output_key": "documents/other/other"}, "documents/other/other"),
        ({"tenant": "alpha"}, "tenant"),
    ],
)
def test_an_assembly_whose_plan_names_keys_outside_its_tenant_writes_and_deletes_nothing(
    redis_url: str, tmp_path: Path, changes: dict[str, Any], named: str
) -> None:
    """The plan's keys are checked again by the assembler, as a synthesis job's key is by
    its worker: each segment's key is its own, the file's lies in the document's own folder
    or where the tenant's requests may write, and the plan is the job's tenant's."""
    connection, storage, settings = setup(redis_url, tmp_path)
    settings = settings.model_copy(update={"document_keep_segments": False})
    out = tmp_path / "out"
    document_id = synthetic_document(connection, out, minutes=1)
    victim = out / "tenants/alpha/orders/42.wav"
    victim.parent.mkdir(parents=True)
    victim.write_bytes(b"another tenant's audio")
    tamper(connection, document_id, **changes)
    before = sorted(p for p in out.rglob("*") if p.is_file())
    with pytest.raises(InvalidRequestError, match=f"document {document_id}") as refused:
        assemble(connection, storage, settings, document_id, "a", tenant="default")
    assert named in str(refused.value)
    assert sorted(p for p in out.rglob("*") if p.is_file()) == before  # nothing written or gone
    assert storage.files == 0
    assert load_result(connection, document_id) is None


def test_an_assembly_whose_done_record_names_another_object_reads_nothing_of_it(
    redis_url: str, tmp_path: Path
) -> None:
    """A segment's recorded audio must be its own key's object: a done hash rewritten in Redis
    to name another tenant's file is refused before any audio is read or written."""
    connection, storage, settings = setup(redis_url, tmp_path)
    out = tmp_path / "out"
    document_id = synthetic_document(connection, out, minutes=1)
    victim = out / "tenants/alpha/orders/42.wav"
    victim.parent.mkdir(parents=True)
    sf.write(str(victim), [0.0] * 2400, 24000)  # a readable WAV of another tenant's
    done = document_key(document_id, "done")
    record = SegmentDone.model_validate_json(connection.hget(done, "0") or b"")
    rewritten = record.model_copy(update={"uri": victim.as_uri()})
    connection.hset(done, "0", rewritten.model_dump_json())
    with pytest.raises(InvalidRequestError, match="segment 0's recorded audio"):
        assemble(connection, storage, settings, document_id, "a", tenant="default")
    assert storage.files == 0 and load_result(connection, document_id) is None


def waiting_job(connection: redis.Redis, job_id: str) -> None:
    """An RQ job with this id waiting in a queue (no worker here runs it)."""
    Queue("waiting", connection=connection).enqueue_call("os.getcwd", job_id=job_id)


@pytest.mark.parametrize("waiting", ["segment", "assembly", "nothing"])
def test_the_keepalive_renews_a_document_while_a_job_of_it_waits(
    redis_url: str, tmp_path: Path, waiting: str
) -> None:
    """A document noted live and due (its TTL last renewed a third of it ago) is renewed when
    a segment's job or its assembly job still waits, and forgotten by the keepalive (its TTL
    left to run out) when nothing of it waits."""
    connection, _, settings = setup(redis_url, tmp_path)
    settings = settings.model_copy(update={"result_ttl_s": 600})
    document_id = synthetic_document(connection, tmp_path / "out", minutes=1)
    connection.expire(document_key(document_id), 5)
    if waiting == "segment":
        waiting_job(connection, "j0")
    if waiting == "assembly":
        connection.set(document_key(document_id, "assembly"), "assembly-1", ex=5)
        waiting_job(connection, "assembly-1")
    connection.zadd(LIVE_DOCUMENTS, {document_id: 0})  # renewed long ago: due
    renewed = DocumentKeepalive(connection, settings, holder="w").tick()
    if waiting == "nothing":
        assert renewed == [] and connection.zscore(LIVE_DOCUMENTS, document_id) is None
        assert connection.ttl(document_key(document_id)) <= 5
        return
    assert renewed == [document_id]
    for part in ("", "jobs", "done"):
        assert connection.ttl(document_key(document_id, part)) > 5
    assert (connection.zscore(LIVE_DOCUMENTS, document_id) or 0) > 0
