"""A folder's note beside each job's audio (shared/audio_notes.py), on real files: written with
the audio, trusted only for the file it describes, deleted with the audio."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from shared.audio_notes import holds_audio, note_path, read_note
from shared.settings import load_settings
from shared.storage import FileStorage, audio_metadata

KEY = "tenants/alpha/same.wav"


def storage(root: Path) -> FileStorage:
    return FileStorage(load_settings(env_file=None, storage_url=root.as_uri()), root)


def job_audio(job_id: str, data: bytes) -> tuple[bytes, dict[str, str]]:
    sha256 = hashlib.sha256(data).hexdigest()
    return data, audio_metadata(job_id=job_id, sha256=sha256, duration_s=1.0)


def holds(path: Path, data: bytes) -> bool:
    with path.open("rb") as file:
        return holds_audio(path, file, hashlib.sha256(data).hexdigest())


def test_a_jobs_audio_gets_a_note_describing_its_file(tmp_path: Path) -> None:
    folder = storage(tmp_path)
    data, metadata = job_audio("job-a", b"RIFF first job")
    stored = folder.put(KEY, data, "audio/wav", metadata)
    path = tmp_path / KEY
    note = read_note(path)
    assert note is not None and (note.job_id, note.sha256) == ("job-a", metadata["sha256"])
    assert note.describes(path.stat()) and stored.bytes == len(data)
    source = tmp_path / "assembled.wav"
    source.write_bytes(b"RIFF streamed in")
    _, other_metadata = job_audio("job-b", source.read_bytes())
    folder.put_file("tenants/alpha/streamed.wav", source, "audio/wav", other_metadata)
    streamed = read_note(tmp_path / "tenants/alpha/streamed.wav")
    assert streamed is not None and streamed.job_id == "job-b"


def test_other_objects_get_no_note(tmp_path: Path) -> None:
    storage(tmp_path).put("tenants/alpha/voice.wav", b"RIFF", "audio/wav", {"voice": "x"})
    assert sorted(p.name for p in (tmp_path / "tenants/alpha").iterdir()) == ["voice.wav"]


def test_the_note_vouches_for_its_file_without_reading_it(tmp_path: Path) -> None:
    """Changed in place with its size and mtime put back (no writer of ours does that), the
    file still reads as the job's: the note was believed, the bytes never hashed."""
    data, metadata = job_audio("job-a", b"RIFF first job")
    storage(tmp_path).put(KEY, data, "audio/wav", metadata)
    path = tmp_path / KEY
    before = path.stat()
    with path.open("r+b") as file:
        file.write(b"XXXX")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert holds(path, data)
    note_path(path).unlink()  # no note (a worker from before notes): hashed, refused
    assert not holds(path, data)


def test_a_later_write_is_caught_whatever_note_is_left(tmp_path: Path) -> None:
    folder = storage(tmp_path)
    path = tmp_path / KEY
    first, first_metadata = job_audio("job-a", b"RIFF first job")
    second = b"RIFF a second, longer job"
    folder.put(KEY, first, "audio/wav", first_metadata)
    assert holds(path, first) and not holds(path, second)
    # the second job's audio renamed over the first's, its note not written (a writer killed
    # between the two, or one from before notes): the first's note describes another file
    folder.put(KEY, second, "audio/wav", {})
    assert read_note(path) is not None and read_note(path).job_id == "job-a"  # type: ignore[union-attr]
    assert not holds(path, first) and holds(path, second)
    same_size, same_metadata = job_audio("job-c", b"RIFF a second, LONGER job")
    folder.put(KEY, same_size, "audio/wav", same_metadata)  # same size, its own note
    assert holds(path, same_size) and not holds(path, second) and not holds(path, first)


def test_a_note_that_is_not_one_is_ignored(tmp_path: Path) -> None:
    data, metadata = job_audio("job-a", b"RIFF first job")
    storage(tmp_path).put(KEY, data, "audio/wav", metadata)
    path = tmp_path / KEY
    for junk in (b"{", b"[]", b'{"job_id": 1}', b"x" * 5000):
        note_path(path).write_bytes(junk)
        assert read_note(path) is None
        assert holds(path, data) and not holds(path, b"other")


def test_deleting_the_audio_deletes_its_note(tmp_path: Path) -> None:
    folder = storage(tmp_path)
    data, metadata = job_audio("job-a", b"RIFF first job")
    folder.put(KEY, data, "audio/wav", metadata)
    folder.delete(KEY)
    assert list((tmp_path / "tenants/alpha").iterdir()) == []
    folder.delete(KEY)  # nothing there: no error
