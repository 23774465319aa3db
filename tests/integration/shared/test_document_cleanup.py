"""Deleting a document's segment audio resumes after a crash (no model, real Redis, file
storage): an assembler that dies between publishing the file and deleting the segments leaves
them noted, and the housekeeping duty (`SegmentCleanup`) deletes them once the note is old,
after checking the plan's keys again; a plan rewritten in Redis meanwhile deletes nothing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis

from shared.document_state import (
    SEGMENT_CLEANUP_LOCK,
    SEGMENTS_PENDING,
    DocumentPlanRecord,
    document_key,
    load_result,
    note_segments_pending,
)
from shared.settings import Settings, load_settings
from shared.storage import FileStorage
from tests.doubles.harness import Cluster, read_events, wait_for
from tests.integration.shared.test_document_assembly import tamper
from workers.documents.cleanup import SegmentCleanup
from workers.documents.job import assemble
from workers.tools.bench.document import synthetic_document


class Killed(BaseException):
    """The assembler's process ends here (nothing after this step runs, no handler catches
    it as an ordinary error would be)."""


class DyingStorage(FileStorage):
    """File storage whose `die_at`-th segment deletion kills the assembler."""

    def __init__(self, settings: Settings, root: Path, die_at: int) -> None:
        super().__init__(settings, root)
        self.die_at = die_at
        self.deletes = 0

    def delete(self, key: str) -> None:
        self.deletes += 1
        if self.deletes == self.die_at:
            raise Killed(key)
        super().delete(key)


def setup(redis_url: str, tmp_path: Path) -> tuple[redis.Redis, Settings, Path]:
    settings = load_settings(
        env_file=None,
        redis_url=redis_url,
        storage_url=(tmp_path / "out").as_uri(),
        document_keep_segments=False,
        document_assembly_grace_s=60.0,
    )
    return redis.Redis.from_url(redis_url), settings, tmp_path / "out"


def interrupted_assembly(
    connection: redis.Redis, settings: Settings, out: Path, *, die_at: int
) -> tuple[str, list[Path]]:
    """A document assembled by an assembler that died at its `die_at`-th segment deletion:
    its id and its segments' files."""
    document_id = synthetic_document(connection, out, minutes=2)
    segments = sorted((out / "documents" / document_id / "segments").iterdir())
    assert len(segments) == 2
    with pytest.raises(Killed):
        assemble(connection, DyingStorage(settings, out, die_at), settings, document_id, "a")
    assert load_result(connection, document_id) is not None  # published before it died
    return document_id, segments


def tick(connection: redis.Redis, settings: Settings, out: Path, **changes: Any) -> list[str]:
    """One tick of the duty (its lock cleared first: ticks here are not a heartbeat apart)."""
    connection.delete(SEGMENT_CLEANUP_LOCK)
    settings = settings.model_copy(update=changes)
    time.sleep(0.01)  # a note made just now is older than a grace of 1 ms
    storage = FileStorage(settings, out)
    return SegmentCleanup(connection, settings, holder="w", storage=storage).tick()


def test_segments_left_by_an_assembler_killed_while_deleting_them_are_deleted_by_the_duty(
    redis_url: str, tmp_path: Path
) -> None:
    connection, settings, out = setup(redis_url, tmp_path)
    document_id, segments = interrupted_assembly(connection, settings, out, die_at=2)
    assert [p.exists() for p in segments] == [False, True]  # the first deleted, then it died
    assert tick(connection, settings, out) == []  # within the grace: a live one may be at it
    assert segments[1].exists()
    assert tick(connection, settings, out, document_assembly_grace_s=0.001) == [document_id]
    assert not any(p.exists() for p in segments)
    assert connection.zscore(SEGMENTS_PENDING, document_id) is None
    files = sorted(p.name for p in (out / "documents" / document_id).iterdir() if p.is_file())
    own = ["doc.json", "doc.mp3", "doc.srt", "doc.vtt"]  # the document's own kept, with notes
    assert files == sorted(own + [f".{name}.cosyq.json" for name in own])


def test_an_assembler_that_finishes_leaves_no_note(redis_url: str, tmp_path: Path) -> None:
    connection, settings, out = setup(redis_url, tmp_path)
    document_id = synthetic_document(connection, out, minutes=1)
    assemble(connection, FileStorage(settings, out), settings, document_id, "a")
    assert not (out / "documents" / document_id / "segments" / "00000.wav").exists()
    assert connection.zscore(SEGMENTS_PENDING, document_id) is None


@pytest.mark.parametrize(
    "changes",
    [
        {"segment_key": "tenants/alpha/orders/42.wav"},
        {"segment_key": "documents/other/segments/00000.wav"},
        {"tenant": "alpha"},
        {"plan_of": "other"},
    ],
    ids=["another-tenants-file", "another-document", "another-tenant", "another-plan"],
)
def test_a_plan_rewritten_after_the_crash_makes_the_duty_delete_nothing(
    redis_url: str, tmp_path: Path, changes: dict[str, Any]
) -> None:
    """The duty checks the plan's keys as the assembler does: a plan that names a key not its
    document's own (another tenant's file, another document's segment), or that is another
    tenant's or another document's, deletes nothing at all; the note is dropped."""
    connection, settings, out = setup(redis_url, tmp_path)
    document_id, _ = interrupted_assembly(connection, settings, out, die_at=1)
    for victim in ("tenants/alpha/orders/42.wav", "documents/other/segments/00000.wav"):
        (out / victim).parent.mkdir(parents=True, exist_ok=True)
        (out / victim).write_bytes(b"someone else's audio")
    if "plan_of" in changes:  # the note's document, another document's plan under its key
        raw = connection.get(document_key(document_id)) or b""
        plan = DocumentPlanRecord.model_validate_json(raw)
        other = plan.model_copy(update={"document_id": changes["plan_of"]})
        connection.set(document_key(document_id), other.model_dump_json())
    else:
        tamper(connection, document_id, **changes)
    before = sorted(p for p in out.rglob("*") if p.is_file())
    assert tick(connection, settings, out, document_assembly_grace_s=0.001) == []
    assert sorted(p for p in out.rglob("*") if p.is_file()) == before
    assert connection.zscore(SEGMENTS_PENDING, document_id) is None


def test_a_note_of_a_document_not_assembled_deletes_nothing(redis_url: str, tmp_path: Path) -> None:
    """Only an assembled document's segments are garbage: one still to assemble (or whose
    result expired) keeps them, whatever a note says."""
    connection, settings, out = setup(redis_url, tmp_path)
    document_id = synthetic_document(connection, out, minutes=1)
    note_segments_pending(connection, document_id)
    assert tick(connection, settings, out, document_assembly_grace_s=0.001) == []
    assert (out / "documents" / document_id / "segments" / "00000.wav").exists()
    assert connection.zscore(SEGMENTS_PENDING, document_id) is None


def test_a_running_worker_deletes_what_a_killed_assembler_left(
    redis_url: str, tmp_path: Path
) -> None:
    """The duty runs in every worker's housekeeping: a worker process (the fake engine) started
    after the assembler died deletes the rest within a few heartbeats."""
    cluster = Cluster(
        redis_url=redis_url,
        root=tmp_path,
        overrides={"COSYQ_DOCUMENT_ASSEMBLY_GRACE_S": "0.5"},
    )
    connection, settings, out = setup(redis_url, tmp_path)  # the cluster's storage: root/out
    document_id, segments = interrupted_assembly(connection, settings, out, die_at=1)
    assert all(p.exists() for p in segments)
    cluster.start("run", log_name="w.log")
    try:
        wait_for(lambda: not any(p.exists() for p in segments), 60, "the segments deleted")
        wait_for(lambda: connection.zscore(SEGMENTS_PENDING, document_id) is None, 10, "no note")
    finally:
        cluster.stop_all()
    assert (out / "documents" / document_id / "doc.mp3").exists()
    events = [e.get("event") for e in read_events(tmp_path / "w.log")]
    assert "document_segments_deleted_late" in events
