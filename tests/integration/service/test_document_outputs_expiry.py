"""An assembled document's outputs go once its result has expired, as COSYQ_AUDIO_RETENTION says
(workers/documents/outputs_expiry.py), on disk (each file and its note, then the document's
folder) and on S3 (moto's server over real HTTP), with a real Redis: they stayed for ever
before. Files in the document's own folder go under `unnamed` and `with_result`; a caller's
`output_key` stays under `unnamed` and goes under `with_result` only while it is still that
document's; a document still in Redis keeps its outputs; a record naming another tenant's key
deletes nothing."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from shared.document_outputs import (
    OUTPUT_EXPIRY_LOCK,
    OUTPUT_RECORDS,
    OUTPUTS_DUE,
    DocumentOutputsRecord,
    remember_outputs,
)
from shared.document_state import document_key
from shared.documents import segment_key
from shared.settings import Settings
from shared.storage import DOCUMENT_ID_METADATA, Storage, audio_metadata, open_storage
from tests.integration.shared.test_storage import file_settings
from workers.documents.outputs_expiry import ExpiredOutputs

MakeSettings = Callable[..., Settings]
EXTS = ("mp3", "json", "srt", "vtt")


def _assemble(storage: Storage, stem: str, document_id: str) -> list[str]:
    """The files an assembler writes at `stem`, with its metadata (a note on disk)."""
    written = []
    for ext in EXTS:
        data = f"{ext} of {document_id}".encode()
        meta = {DOCUMENT_ID_METADATA: document_id, "sha256": hashlib.sha256(data).hexdigest()}
        storage.put(f"{stem}.{ext}", data, "application/octet-stream", meta)
        written.append(f"{stem}.{ext}")
    return written


def _job_audio(storage: Storage, key: str, job_id: str) -> None:
    metadata = audio_metadata(job_id=job_id, sha256="0" * 64, duration_s=1.0)
    storage.put(key, f"audio of {job_id}".encode(), "audio/wav", metadata)


def _there(storage: Storage, key: str) -> bool:
    return storage.document_of(key) is not None or storage.job_of(key) is not None


def _record(tenant: str, stem: str, kept: int = 0) -> DocumentOutputsRecord:
    return DocumentOutputsRecord(tenant=tenant, output_key=stem, format="mp3", kept_segments=kept)


def _tick(connection: redis.Redis, duty: ExpiredOutputs, *document_ids: str) -> list[str]:
    connection.zadd(OUTPUTS_DUE, dict.fromkeys(document_ids, 0), xx=True)
    connection.delete(OUTPUT_EXPIRY_LOCK)  # the next tick
    return sorted(duty.tick())


def test_expired_documents_outputs_go_as_retention_says(
    storage_settings: MakeSettings, redis_url: str
) -> None:
    settings = storage_settings(redis_url=redis_url, audio_retention="unnamed")
    connection = redis.Redis.from_url(redis_url)
    storage = open_storage(settings)
    own_stem = "tenants/alpha/documents/doc-a/doc-a"
    own = _assemble(storage, own_stem, "doc-a")
    kept = "tenants/alpha/" + segment_key("doc-a", 0)  # COSYQ_DOCUMENT_KEEP_SEGMENTS
    storage.put(
        kept, b"segment", "audio/wav", audio_metadata(job_id="j0", sha256="0", duration_s=1)
    )
    named = _assemble(storage, "tenants/alpha/books/ch1", "doc-b")  # the caller's output_key
    live = _assemble(storage, "tenants/beta/documents/doc-c/doc-c", "doc-c")  # still in Redis
    stranger = _assemble(storage, "tenants/beta/secret", "doc-x")  # beta's, named by alpha's record
    remember_outputs(connection, settings, "doc-a", _record("alpha", own_stem, kept=1))
    for document_id, tenant, stem in [
        ("doc-b", "alpha", "tenants/alpha/books/ch1"),
        ("doc-c", "beta", "tenants/beta/documents/doc-c/doc-c"),
        ("doc-x", "alpha", "tenants/beta/secret"),
    ]:
        with_result = settings.model_copy(update={"audio_retention": "with_result"})
        remember_outputs(connection, with_result, document_id, _record(tenant, stem))
    connection.set(document_key("doc-c", "result"), "{}", ex=3600)
    duty = ExpiredOutputs(connection, settings, holder="w1", storage=storage)

    assert _tick(connection, duty, "doc-a", "doc-b", "doc-c", "doc-x") == ["doc-a"]
    assert not any(_there(storage, key) for key in [*own, kept])
    assert all(_there(storage, key) for key in named)  # unnamed: the caller's product stays
    assert all(_there(storage, key) for key in live + stranger)
    assert connection.zrange(OUTPUTS_DUE, 0, -1) == [b"doc-c"]  # looked at again later
    assert connection.zscore(OUTPUTS_DUE, "doc-c") > 3000  # at the result's own expiry
    assert connection.hkeys(OUTPUT_RECORDS) == [b"doc-c"]
    if settings.storage_url.startswith("file:"):
        root = Path(settings.storage_url[7:])
        assert not (root / "tenants/alpha/documents/doc-a").exists()  # its folder went too


def test_with_result_deletes_a_named_output_only_while_it_is_the_documents(
    storage_settings: MakeSettings, redis_url: str
) -> None:
    settings = storage_settings(redis_url=redis_url, audio_retention="with_result")
    connection = redis.Redis.from_url(redis_url)
    storage = open_storage(settings)
    stem = "tenants/alpha/books/ch1"
    files = _assemble(storage, stem, "doc-a")
    remember_outputs(connection, settings, "doc-a", _record("alpha", stem))
    reused = "tenants/alpha/books/ch1.mp3"  # a later job of alpha's wrote its audio there
    storage.put(
        reused, b"later", "audio/mpeg", audio_metadata(job_id="j9", sha256="1", duration_s=1)
    )
    duty = ExpiredOutputs(connection, settings, holder="w1", storage=storage)
    assert _tick(connection, duty, "doc-a") == ["doc-a"]
    assert storage.job_of(reused) == "j9"  # the later job's audio stays for its own expiry
    assert not any(_there(storage, key) for key in files if key != reused)
    if settings.storage_url.startswith("file:"):
        left = sorted(p.name for p in Path(settings.storage_url[7:]).rglob("*") if p.is_file())
        assert left == [".ch1.mp3.cosyq.json", "ch1.mp3"]  # each deleted file's note went too


@pytest.mark.parametrize(
    ("retention", "outputs", "recorded"),
    [
        ("keep", ("tenants/alpha/documents/doc-a/doc-a", 1), False),
        ("unnamed", ("tenants/alpha/documents/doc-a/doc-a", 0), True),
        ("unnamed", ("tenants/alpha/books/ch1", 0), False),  # the caller's, nothing else
        ("unnamed", ("tenants/alpha/books/ch1", 2), True),  # its kept segments go
        ("with_result", ("tenants/alpha/books/ch1", 0), True),
    ],
)
def test_what_a_documents_retention_records(
    redis_url: str, tmp_path: Path, retention: str, outputs: tuple[str, int], recorded: bool
) -> None:
    settings = file_settings(tmp_path, redis_url=redis_url, audio_retention=retention)
    connection = redis.Redis.from_url(redis_url)
    remember_outputs(connection, settings, "doc-a", _record("alpha", *outputs))
    assert connection.exists(OUTPUT_RECORDS, OUTPUTS_DUE) == (2 if recorded else 0)
