"""Writing a user's --out file so that a failed command never empties or truncates it.

The bytes go to a temporary file beside the target (same folder, so the final rename stays on
one file system and is atomic); only a command that succeeded moves it into place. A job that
fails, times out or does not exist leaves an existing file exactly as it was, and no new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from producer.commands.exits import UsageError
from shared.errors import ObjectNotFoundError, StorageError
from shared.results import AUDIO_FORMATS, SynthesisResult
from shared.settings_env import redact_url
from shared.storage import Storage, stored_key


def check_out_folder(path: Path | None) -> None:
    """--out's folder made and writable, checked before a job is submitted or waited for:
    UsageError (exit 2) rather than a job whose audio has nowhere to go."""
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {path}: cannot write there ({e.strerror or e})") from e
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise UsageError(f"--out {path}: cannot write there (permission denied)")


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[IO[bytes]]:
    """A binary file to write; on a clean exit of the block it becomes `path` (mode as a
    plain open would give it), on an error it is removed and `path` is left untouched."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    except OSError as e:  # a folder that cannot be made or written: the user's --out
        raise UsageError(f"--out {path}: cannot write there ({e.strerror or e})") from e
    temporary = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
        os.chmod(temporary, _new_file_mode(path))
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def audio_format_of(out: Path | None, fmt: str | None, *, named: str = "--format") -> str | None:
    """The audio format an --out file's suffix names (none: `fmt`); UsageError for a suffix
    that is no audio format or that contradicts `fmt` (the bytes would not be what it says)."""
    if out is None or not out.suffix:
        return fmt
    suffix = out.suffix.lstrip(".").lower()
    if suffix not in AUDIO_FORMATS:
        raise UsageError(f"--out: .{suffix} is not one of {', '.join(AUDIO_FORMATS)}")
    if fmt is not None and fmt != suffix:
        raise UsageError(f"--out: .{suffix} does not match {named} {fmt}")
    return suffix


def check_stored(storage: Storage, uri: str) -> None:
    """A result's file is read only under this host's COSYQ_STORAGE_URL, as the front reads
    it: StorageError (exit 1) for a URI elsewhere (a worker on another storage, or a result
    rewritten in Redis to name any other file), before anything is read or written."""
    if stored_key(storage.base_uri, uri) is None:
        raise StorageError(
            f"the result names {redact_url(uri)}, which is not under COSYQ_STORAGE_URL "
            f"({redact_url(storage.base_uri)}): not read (a worker writing to another "
            "storage, or a result rewritten in Redis)"
        )


def check_own_audio(data: bytes, result: SynthesisResult) -> None:
    """The bytes read are the job's own (its result's sha256), as the front checks: a later job
    of the tenant given the same output_key replaces the file, and --out never gets that job's
    audio. ObjectNotFoundError (exit 1, --out left as it was) otherwise."""
    if hashlib.sha256(data).hexdigest() != result.sha256:
        raise ObjectNotFoundError(
            f"{redact_url(result.uri)} now holds another job's audio (a later job wrote the "
            f"same output_key): job {result.job_id}'s audio is gone; --out not written"
        )


def write_replacing(path: Path, data: bytes) -> None:
    with replacing(path) as out:
        out.write(data)


def copy_replacing(source: Path, path: Path) -> None:
    """A local file copied to `path` in blocks (an hour of audio is never read whole)."""
    with replacing(path) as out, source.open("rb") as data:
        shutil.copyfileobj(data, out)


def _new_file_mode(path: Path) -> int:
    """The existing file's permissions, else what open() would give a new file (umask)."""
    with contextlib.suppress(OSError):
        return path.stat().st_mode & 0o7777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
