"""A document that is never assembled has its segments' audio deleted once its plan expires (no
model, real Redis, file storage): `retry` reuses that audio while the plan lives, so the
housekeeping duty (`ExpiredSegments`) deletes it only once the plan is gone, from the record
written with the plan; a retried document's renewed plan puts it off, and a record rewritten
in Redis deletes nothing outside the document's own segments."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from shared.document_state import (
    SEGMENT_EXPIRY_LOCK,
    SEGMENT_RECORDS,
    SEGMENTS_DUE,
    DocumentPlanRecord,
    SegmentPlan,
    document_key,
    job_ids,
    load_plan,
    renew,
    save_plan,
)
from shared.documents import segment_key
from shared.settings import Settings, load_settings
from shared.storage import FileStorage, open_storage
from tests.doubles.harness import Cluster, read_events, wait_for
from tests.integration.conftest import S3Endpoint
from tests.integration.shared.test_storage import make_bucket, s3_settings
from workers.documents.expiry import ExpiredSegments
from workers.documents.job import assemble
from workers.tools.bench.document import synthetic_document

VICTIMS = (
    "tenants/alpha/orders/42.wav",
    "tenants/alpha/documents/other/segments/00000.wav",
    "documents/other/segments/00000.wav",
    "voices/alice.wav",
)


def setup(redis_url: str, tmp_path: Path) -> tuple[redis.Redis, Settings, Path]:
    settings = load_settings(
        env_file=None,
        redis_url=redis_url,
        storage_url=(tmp_path / "out").as_uri(),
        document_keep_segments=False,
    )
    return redis.Redis.from_url(redis_url), settings, tmp_path / "out"


def short_lived_document(connection: redis.Redis, out: Path, ttl_s: int = 1) -> tuple[str, Path]:
    """A document whose segments are stored (two, as if their jobs had run) and whose plan
    lives `ttl_s` from now (as a failed or canceled one's does from its last progress): its id
    and its segments' folder."""
    document_id = synthetic_document(connection, out, minutes=2)
    plan = load_plan(connection, document_id)
    ids = [job_ids(connection, document_id)[s.index] for s in plan.segments]
    with connection.pipeline() as pipe:
        save_plan(pipe, plan, ids, ttl_s)  # as the producer writes it, with this TTL
        pipe.execute()
    folder = out / "documents" / document_id / "segments"
    assert len(list(folder.iterdir())) == 2
    return document_id, folder


def tick(connection: redis.Redis, settings: Settings, out: Path, **changes: Any) -> list[str]:
    """One tick of the duty (its lock cleared first: ticks here are not a heartbeat apart)."""
    connection.delete(SEGMENT_EXPIRY_LOCK)
    settings = settings.model_copy(update=changes)
    storage = FileStorage(settings, out)
    return ExpiredSegments(connection, settings, holder="w", storage=storage).tick()


def expire(connection: redis.Redis, document_id: str) -> None:
    """Wait until the plan is gone and its record due (both a second from `save_plan`)."""
    wait_for(lambda: not connection.exists(document_key(document_id)), 10, "the plan to expire")
    due = connection.zscore(SEGMENTS_DUE, document_id) or 0.0
    time.sleep(max(0.0, due - time.time() + 0.01))


def plant_victims(out: Path) -> list[Path]:
    for victim in VICTIMS:
        (out / victim).parent.mkdir(parents=True, exist_ok=True)
        (out / victim).write_bytes(b"someone else's audio")
    return sorted(p for p in out.rglob("*") if p.is_file())


def test_a_failed_documents_segments_are_deleted_once_its_plan_expires(
    redis_url: str, tmp_path: Path
) -> None:
    connection, settings, out = setup(redis_url, tmp_path)
    document_id, folder = short_lived_document(connection, out)
    assert tick(connection, settings, out) == []  # retriable: its audio is kept
    assert len(list(folder.iterdir())) == 2
    expire(connection, document_id)
    others = [p for p in plant_victims(out) if folder not in p.parents]
    assert tick(connection, settings, out) == [document_id]
    assert not folder.exists()  # and its folder: nothing names the document any more
    assert sorted(p for p in out.rglob("*") if p.is_file()) == others  # nothing else touched
    assert connection.hget(SEGMENT_RECORDS, document_id) is None
    assert connection.zscore(SEGMENTS_DUE, document_id) is None


def test_a_retried_document_keeps_its_segments_until_its_assembler_deletes_them(
    redis_url: str, tmp_path: Path
) -> None:
    """A retry renews the plan before it expires: the look at its first expiry finds the
    plan there, deletes nothing and looks again at the renewed expiry; the assembly then reads
    every segment and deletes them, and drops the record."""
    connection, settings, out = setup(redis_url, tmp_path)
    document_id, folder = short_lived_document(connection, out)
    renew(connection, document_id, 3600)  # what `retry_document` does in its MULTI
    due = connection.zscore(SEGMENTS_DUE, document_id) or 0.0
    time.sleep(max(0.0, due - time.time() + 0.01))  # the first expiry has come
    assert tick(connection, settings, out) == []
    assert len(list(folder.iterdir())) == 2
    assert (connection.zscore(SEGMENTS_DUE, document_id) or 0.0) > time.time() + 3000
    result = assemble(connection, FileStorage(settings, out), settings, document_id, "a")
    assert result.segments == 2  # every segment's audio was there to read
    assert not folder.exists()  # and its folder: nothing names the document any more
    assert connection.hget(SEGMENT_RECORDS, document_id) is None
    assert connection.zscore(SEGMENTS_DUE, document_id) is None


def test_kept_segments_are_not_deleted(redis_url: str, tmp_path: Path) -> None:
    """COSYQ_DOCUMENT_KEEP_SEGMENTS keeps every document's segments: the record is dropped."""
    connection, settings, out = setup(redis_url, tmp_path)
    document_id, folder = short_lived_document(connection, out)
    expire(connection, document_id)
    assert tick(connection, settings, out, document_keep_segments=True) == []
    assert len(list(folder.iterdir())) == 2
    assert connection.hget(SEGMENT_RECORDS, document_id) is None


@pytest.mark.parametrize(
    "record",
    [
        '{"tenant": "alpha", "segments": 2}',
        '{"tenant": "../tenants/alpha", "segments": 2}',
        '{"tenant": "alpha/orders", "segments": 1}',
        '{"tenant": null, "segments": 1000000000}',
        "not json",
    ],
    ids=["another-tenant", "a-path-tenant", "a-slash-tenant", "too-many", "garbage"],
)
def test_a_rewritten_record_deletes_nothing_outside_the_document(
    redis_url: str, tmp_path: Path, record: str
) -> None:
    """A record rewritten in Redis names keys only through the document's id and a tenant
    name, each checked: another tenant's name reaches only that tenant's segments of this
    document (there are none), a path or too many segments is refused."""
    connection, settings, out = setup(redis_url, tmp_path)
    document_id, _ = short_lived_document(connection, out)
    connection.hset(SEGMENT_RECORDS, document_id, record)
    expire(connection, document_id)
    before = plant_victims(out)
    tick(connection, settings, out)
    assert sorted(p for p in out.rglob("*") if p.is_file()) == before
    assert connection.zscore(SEGMENTS_DUE, document_id) is None


@pytest.mark.parametrize(
    "member", ["other", "../tenants/alpha/orders", "other/../../voices", "x" * 65]
)
def test_a_record_under_another_id_deletes_nothing_but_a_gone_documents_segments(
    redis_url: str, tmp_path: Path, member: str
) -> None:
    """A record planted for an id that is not a document's (a path, too long) is refused; one
    for another document deletes only that document's own segments, and only once its plan
    is gone (while it lives, its audio is kept: it may be retried)."""
    connection, settings, out = setup(redis_url, tmp_path)
    live, live_folder = short_lived_document(connection, out, ttl_s=3600)
    connection.hset(SEGMENT_RECORDS, member, '{"tenant": null, "segments": 2}')
    connection.zadd(SEGMENTS_DUE, {member: time.time() - 1, live: time.time() - 1})
    before = plant_victims(out)
    assert tick(connection, settings, out) == ([member] if member == "other" else [])
    after = sorted(p for p in out.rglob("*") if p.is_file())
    gone = [out / "documents/other/segments/00000.wav"] if member == "other" else []
    assert after == [p for p in before if p not in gone]
    assert len(list(live_folder.iterdir())) == 2  # its plan lives: looked at again later
    assert (connection.zscore(SEGMENTS_DUE, live) or 0.0) > time.time() + 3000


def test_a_running_worker_deletes_an_expired_documents_segments(
    redis_url: str, tmp_path: Path
) -> None:
    """The duty runs in every worker's housekeeping: a worker process (the fake engine)
    deletes a failed document's segments once its plan has expired."""
    cluster = Cluster(redis_url=redis_url, root=tmp_path)
    connection, _, out = setup(redis_url, tmp_path)  # the cluster's storage: root/out
    document_id, folder = short_lived_document(connection, out, ttl_s=2)
    cluster.start("run", log_name="w.log")
    try:
        wait_for(lambda: not folder.exists(), 60, "the segments and their folder deleted")
    finally:
        cluster.stop_all()
    assert connection.hget(SEGMENT_RECORDS, document_id) is None
    events = [e.get("event") for e in read_events(tmp_path / "w.log")]
    assert "document_segments_expired" in events


def test_on_s3_only_the_documents_own_segments_under_its_tenant_are_deleted(
    redis_url: str, s3_endpoint: S3Endpoint
) -> None:
    """The same on S3 (moto's server over HTTP), for a named tenant's document: its segments
    under `tenants/alpha/` go, the same keys under another tenant's prefix and another
    document's stay."""
    bucket = f"expiry-{uuid.uuid4().hex[:8]}"
    client: Any = make_bucket(s3_endpoint, bucket)
    settings = s3_settings(s3_endpoint, f"s3://{bucket}/p", redis_url=redis_url)
    connection, storage = redis.Redis.from_url(redis_url), open_storage(settings)
    document_id = uuid.uuid4().hex
    keys = [f"tenants/alpha/{segment_key(document_id, i)}" for i in range(3)]
    kept = [
        f"tenants/beta/{segment_key(document_id, 0)}",
        f"{segment_key(document_id, 0)}",
        f"tenants/alpha/{segment_key('other', 0)}",
        f"tenants/alpha/documents/{document_id}/{document_id}.mp3",
    ]
    for key in keys + kept:
        storage.put(key, b"audio", "audio/wav", {})
    plan = DocumentPlanRecord(
        document_id=document_id, created_at="2026-01-01T00:00:00+00:00", seed=0, job={},
        format="mp3", sample_format="pcm16", sample_rate=24000, priority="default",
        output_key=f"tenants/alpha/documents/{document_id}/{document_id}", tenant="alpha",
        segments=[SegmentPlan(index=i, text="x", plain="x", pause_before_s=0, seed=i, key=k)
                  for i, k in enumerate(keys)],
    )  # fmt: skip
    with connection.pipeline() as pipe:
        save_plan(pipe, plan, ["j0", "j1", "j2"], 1)
        pipe.execute()
    expire(connection, document_id)
    connection.delete(SEGMENT_EXPIRY_LOCK)
    assert ExpiredSegments(connection, settings, holder="w", storage=storage).tick() == [
        document_id
    ]
    listed = client.list_objects_v2(Bucket=bucket)
    assert sorted(o["Key"] for o in listed.get("Contents", [])) == sorted(f"p/{k}" for k in kept)
