"""The note a folder storage keeps beside a job's audio: which job's bytes the file holds.

S3 keeps the writing job's id in the object's own metadata (`JOB_ID_METADATA`). A folder has no
metadata every filesystem keeps (Python's `os.setxattr` is Linux-only, and tmpfs or a network
mount may refuse user attributes), so `FileStorage` writes `.<name>.cosyq.json` beside the audio,
once the audio is renamed into place: the job's id and sha256, and the audio file's own
identity (inode, size, modification time in ns, from the written file's fstat).

`GET /v1/jobs/{id}/audio` must never relay a later job's audio (same `output_key`) as an
earlier job's. It trusts a note only while the note describes the very file it opened: every
write renames a new file over the path, a new inode, so a note left by the earlier job (a writer
killed between the audio and its note, or a worker from before notes) no longer describes it.
No note, a note that does not parse, or one that does not describe the open file: the file is
hashed, as before notes. A file edited in place with its size and mtime put back is not caught:
no writer of ours does that.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass
from io import BufferedReader
from pathlib import Path

NOTE_SUFFIX = ".cosyq.json"
MAX_NOTE_BYTES = 4096  # a note is ~200 bytes; anything longer is not one


@dataclass(frozen=True)
class AudioNote:
    """What a job (or a document's assembler: `document_id`, `job_id` "") wrote at a path,
    and the file it wrote there."""

    job_id: str
    sha256: str
    size: int
    inode: int
    mtime_ns: int
    document_id: str = ""

    @classmethod
    def of(
        cls, stat: os.stat_result, *, job_id: str, sha256: str, document_id: str = ""
    ) -> AudioNote:
        return cls(job_id, sha256, stat.st_size, stat.st_ino, stat.st_mtime_ns, document_id)

    def describes(self, stat: os.stat_result) -> bool:
        """The note was written for the file `stat` is of (not one renamed over it since)."""
        return (self.inode, self.size, self.mtime_ns) == (
            stat.st_ino,
            stat.st_size,
            stat.st_mtime_ns,
        )

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()


def note_path(audio: Path) -> Path:
    """Where the note of the audio at `audio` lives: a hidden file beside it."""
    return audio.with_name(f".{audio.name}{NOTE_SUFFIX}")


def read_note(audio: Path) -> AudioNote | None:
    """The note beside `audio`; None when there is none or it cannot be read as one."""
    try:
        with note_path(audio).open("rb") as file:
            raw = file.read(MAX_NOTE_BYTES + 1)
        fields = json.loads(raw) if len(raw) <= MAX_NOTE_BYTES else None
        note = AudioNote(**fields) if isinstance(fields, dict) else None
    except (OSError, ValueError, TypeError):
        return None
    texts = note is not None and all(
        isinstance(v, str) for v in (note.job_id, note.sha256, note.document_id)
    )
    numbers = note is not None and all(
        isinstance(v, int) for v in (note.size, note.inode, note.mtime_ns)
    )
    return note if texts and numbers else None


def holds_audio(audio: Path, file: BufferedReader, sha256: str) -> bool:
    """The open `file` (of `audio`) holds the bytes whose sha256 is `sha256`: its note says so
    when the note describes this very file, else its bytes are hashed (and `file` rewound)."""
    note = read_note(audio)
    if note is not None and note.describes(os.fstat(file.fileno())):
        return note.sha256 == sha256
    digest = hashlib.file_digest(file, "sha256").hexdigest()
    file.seek(0)
    return digest == sha256
