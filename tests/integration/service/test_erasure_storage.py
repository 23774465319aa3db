"""An erasure deletes on disk (each file and its note, then the document's folder) and on S3
(moto's server over real HTTP) alike, with a real Redis and no worker: a queued document is
canceled, its segments' and outputs' objects go, a caller's output_key stays unless asked for,
and an output_key a later job wrote over stays (it is that job's)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest

from producer import CosyqClient
from shared.document_state import job_ids
from shared.documents import document_folder, segment_key
from shared.settings import Settings
from shared.storage import DOCUMENT_ID_METADATA, Storage, audio_metadata, open_storage

MakeSettings = Callable[..., Settings]


def _put(storage: Storage, key: str, meta: dict[str, str]) -> None:
    storage.put(key, b"bytes", "application/octet-stream", meta)


def _document_files(storage: Storage, stem: str, document_id: str) -> list[str]:
    files = [f"{stem}.{ext}" for ext in ("wav", "json", "srt", "vtt")]
    for key in files:
        sha = hashlib.sha256(b"bytes").hexdigest()
        _put(storage, key, {DOCUMENT_ID_METADATA: document_id, "sha256": sha})
    return files


def _there(storage: Storage, key: str) -> bool:
    return storage.document_of(key) is not None or storage.job_of(key) is not None


@pytest.mark.parametrize("output_key", [False, True])
def test_erasing_a_document_deletes_its_objects(
    storage_settings: MakeSettings,
    redis_url: str,
    output_key: bool,
) -> None:
    settings = storage_settings(redis_url=redis_url)
    storage = open_storage(settings)
    with CosyqClient(settings) as client:
        own = client.submit_document({"text": "Its own folder."})
        named = client.submit_document({"text": "A named file.", "output_key": "books/ch1"})
        reused = client.submit_document({"text": "Reused.", "output_key": "books/ch2"})
        segments = []
        for document_id in (own, named, reused):
            for index, job_id in job_ids(client.connection, document_id).items():
                key = segment_key(document_id, index)
                _put(storage, key, audio_metadata(job_id=job_id, sha256="0" * 64, duration_s=1))
                segments.append(key)
        own_files = _document_files(storage, document_folder(own) + own, own)
        named_files = _document_files(storage, "books/ch1", named)
        _document_files(storage, "books/ch2", reused)
        later = audio_metadata(job_id="later-job", sha256="1" * 64, duration_s=1.0)
        _put(storage, "books/ch2.wav", later)  # a later job of the tenant's wrote over it

        own_segments = len(job_ids(client.connection, own))
        erased = [client.erase_document(d, output_key=output_key) for d in (own, named, reused)]
    assert not any(_there(storage, key) for key in [*segments, *own_files])
    assert all(_there(storage, key) for key in named_files) is not output_key
    assert [len(e.kept) for e in erased] == ([0, 4, 3] if not output_key else [0, 0, 0])
    assert storage.job_of("books/ch2.wav") == "later-job"
    assert len(erased[0].deleted) == 4 + own_segments  # its file, manifest, captions, segments
    if settings.storage_url.startswith("file:"):
        root = Path(settings.storage_url.removeprefix("file://"))
        assert not (root / "documents").exists() or not any((root / "documents").iterdir())
