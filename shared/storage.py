"""Where audio lands: a folder (`file:///path`) or a bucket (`s3://bucket/prefix`).

`open_storage(settings)` picks the backend from `storage_url`. Keys are relative to the prefix and
checked again here (not only in the request), so no key can write outside it. Disk writes go to a
temporary file beside the target and are renamed into place: a reader never sees half a file; a
failed write removes its temp file, and one left by a killed writer (its name says which host
and pid) is removed by the next write of the same key, the job's retry: at once when that pid is
gone from this host, else once it is older than the job timeout.
Either backend reads both kinds of URI (`get`), for prompt audio; a stored result is read only
when `stored_key` finds it under the storage's own base URI (the front, `cosyq say --out`).
Failures are StorageError (permanent: fix the configuration) or StorageUnavailableError (may
pass: retry), decided by errno or S3 error code. Beside a job's audio a folder keeps a note of
which job wrote it (shared/audio_notes.py), as S3 keeps it in the object's metadata; deleting
the audio deletes its note.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import shutil
import socket
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from shared.audio_notes import AudioNote, note_path, read_note
from shared.errors import (
    CosyqError,
    InvalidRequestError,
    ObjectNotFoundError,
    StorageError,
    StorageUnavailableError,
)
from shared.jobs import check_output_key
from shared.logs import get_logger
from shared.output_keys import automatic_key, check_tenant_key
from shared.s3 import S3Access
from shared.settings import Settings
from shared.tenants import DEFAULT_TENANT

log = get_logger(__name__)

MAX_KEY_CHARS = 1024  # the longest key a storage writes (`uri_for`)
_JOB_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
# errno values that may clear up by themselves: a full disk, a flaky network mount.
_TRANSIENT_ERRNOS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EIO,
        errno.EAGAIN,
        errno.EINTR,
        errno.EBUSY,
        errno.ETIMEDOUT,
        errno.ESTALE,
        errno.ENOLCK,
    }
)


@dataclass(frozen=True)
class StoredObject:
    """Where a put landed."""

    uri: str
    bytes: int


def object_key(
    job_id: str,
    ext: str,
    output_key: str | None = None,
    now: datetime | None = None,
    *,
    tenant: str = DEFAULT_TENANT,
    document: tuple[str, int] | None = None,
) -> str:
    """The key for a job's audio, relative to the storage prefix, inside its tenant's prefix.

    Default `<tenant prefix><yyyy>/<mm>/<dd>/<job id>.<ext>` (UTC date of `now`; pass the job's
    enqueue time so a retry overwrites the same key). An `output_key` (the producer has placed
    it under the tenant's prefix) is checked to lie there, outside the reserved areas unless it
    is the job's own `document` segment's (shared/output_keys.py), `.<ext>` appended when it
    does not already end with it.
    """
    if not ext.isalnum():
        raise ValueError(f"extension {ext!r}: letters and digits only")
    if output_key is not None:
        key = check_output_key(output_key, limit=1024)
        key = check_tenant_key(tenant, key, document) or key
        return key if key.endswith("." + ext) else f"{key}.{ext}"
    if not job_id or not set(job_id) <= _JOB_ID_CHARS:
        raise ValueError(f"job id {job_id!r}: letters, digits, '_' and '-' only")
    return automatic_key(tenant, job_id, ext, (now or datetime.now(UTC)).astimezone(UTC))


JOB_ID_METADATA = "job-id"  # the audio object's metadata naming the job that wrote it
DOCUMENT_ID_METADATA = "document-id"  # an assembled document's files': the document's id


def audio_metadata(*, job_id: str, sha256: str, duration_s: float) -> dict[str, str]:
    """The metadata set on every audio object (S3 user metadata: ASCII strings)."""
    return {JOB_ID_METADATA: job_id, "sha256": sha256, "duration-s": f"{duration_s:.3f}"}


class Storage(ABC):
    """Writes under one base URI; reads any file:// or s3:// URI, up to `max_read_bytes`."""

    def __init__(self, settings: Settings) -> None:
        self._max_read_bytes = settings.max_read_bytes
        self._s3 = S3Access(settings)

    @property
    @abstractmethod
    def base_uri(self) -> str:
        """The folder or bucket prefix every key is written under."""

    @abstractmethod
    def put(
        self, key: str, data: bytes, content_type: str, metadata: Mapping[str, str]
    ) -> StoredObject:
        """Write `data` at `key` under the base URI, replacing any object there."""

    @abstractmethod
    def put_file(
        self, key: str, path: Path, content_type: str, metadata: Mapping[str, str]
    ) -> StoredObject:
        """Write the local file `path` at `key`, streamed (never whole in memory), atomically."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove the object at `key` under the base URI (no error when it is not there)."""

    @abstractmethod
    def uri_for(self, key: str) -> str:
        """The URI `put(key, ...)` writes to."""

    @abstractmethod
    def check_readable(self) -> None:
        """Raise unless the base URI can be read (a folder that lists, a bucket that answers)."""

    def job_of(self, key: str) -> str | None:
        """The job whose audio is at `key` now; None when none is there or it cannot tell."""
        return None

    def document_of(self, key: str) -> str | None:
        """The document whose assembled file is at `key` now; None when none is there or it
        cannot tell (a file written before notes were kept beside a document's files)."""
        return None

    def remove_empty_folder(self, key: str) -> None:
        """Remove the folder `key` (a prefix ending in "/") if it is empty; S3 has none."""
        return None

    def get(self, uri: str) -> bytes:
        """Read a whole object; ObjectNotFoundError when it is not there."""
        parts = urlsplit(uri)
        if parts.scheme == "file":
            return self._read_file(Path(unquote(parts.path)), uri)
        if parts.scheme == "s3":
            key = parts.path.lstrip("/")
            if not parts.netloc or not key:
                raise InvalidRequestError(f"{uri}: an s3 URI needs a bucket and a key")
            return self._s3.get(parts.netloc, key, uri, self._max_read_bytes)
        raise InvalidRequestError(f"{uri}: only file:// and s3:// URIs can be read")

    def _read_file(self, path: Path, uri: str) -> bytes:
        try:
            with path.open("rb") as file:
                size = os.fstat(file.fileno()).st_size
                _check_size(uri, size, self._max_read_bytes)
                return file.read()
        except FileNotFoundError as e:
            raise ObjectNotFoundError(f"{uri}: no such file") from e
        except IsADirectoryError as e:
            raise InvalidRequestError(f"{uri}: is a directory, not a file") from e
        except PermissionError as e:
            raise StorageError(f"{uri}: permission denied") from e
        except OSError as e:
            raise file_error(e, f"cannot read {uri}") from e


def _check_size(uri: str, size: int, limit: int) -> None:
    if size > limit:
        raise InvalidRequestError(f"{uri}: {size:,} bytes, limit {limit:,} (COSYQ_MAX_READ_BYTES)")


class FileStorage(Storage):
    """A local or mounted folder. Metadata is not kept beside the file (the result carries it),
    but for a job's audio: its note (shared/audio_notes.py)."""

    def __init__(self, settings: Settings, root: Path) -> None:
        super().__init__(settings)
        self.root = root
        self._stale_temp_s = float(settings.job_timeout_s)  # no live writer is older

    @property
    def base_uri(self) -> str:
        return self.root.as_uri()

    def put(
        self, key: str, data: bytes, content_type: str, metadata: Mapping[str, str]
    ) -> StoredObject:
        path = self.root / check_output_key(key, limit=1024)
        try:
            self._make_folders(key, path.parent)
            written = _write_atomically(path, data)
        except OSError as e:
            raise file_error(e, f"cannot write {path}") from e
        self._written(path, written, metadata)
        return StoredObject(uri=path.as_uri(), bytes=len(data))

    def put_file(
        self, key: str, path: Path, content_type: str, metadata: Mapping[str, str]
    ) -> StoredObject:
        target = self.root / check_output_key(key, limit=1024)
        try:
            self._make_folders(key, target.parent)
            with path.open("rb") as source:
                written = _write_atomically(target, source)
        except OSError as e:
            raise file_error(e, f"cannot write {target}") from e
        self._written(target, written, metadata)
        return StoredObject(uri=target.as_uri(), bytes=written.st_size)

    def _written(self, path: Path, written: os.stat_result, metadata: Mapping[str, str]) -> None:
        """After a write: a job's audio gets its note; killed writers' temp files go."""
        if _write_note(path, written, metadata):
            _remove_stale_temps(note_path(path), self._stale_temp_s)
        _remove_stale_temps(path, self._stale_temp_s)

    def _make_folders(self, key: str, folder: Path) -> None:
        """Make `folder` under the root one level at a time, each level checked to resolve
        inside the root before it is made: a symlink in the root never leads mkdir outside."""
        self.root.mkdir(parents=True, exist_ok=True)
        root = self.root.resolve()
        level = self.root
        for part in folder.relative_to(self.root).parts:
            level = level / part
            if not level.resolve().is_relative_to(root):
                raise StorageError(f"{key}: resolves outside {self.root} (a symlink?)")
            level.mkdir(exist_ok=True)

    def delete(self, key: str) -> None:
        path = self.root / check_output_key(key, limit=1024)
        try:
            path.unlink(missing_ok=True)
            note_path(path).unlink(missing_ok=True)
        except OSError as e:
            raise file_error(e, f"cannot delete {path}") from e

    def uri_for(self, key: str) -> str:
        return (self.root / check_output_key(key, limit=1024)).as_uri()

    def job_of(self, key: str) -> str | None:
        """The note's job, while the note describes the very file at `key`."""
        note = self._note(key)
        return note.job_id or None if note is not None else None

    def document_of(self, key: str) -> str | None:
        """The note's document, while the note describes the very file at `key`."""
        note = self._note(key)
        return note.document_id or None if note is not None else None

    def _note(self, key: str) -> AudioNote | None:
        path = self.root / check_output_key(key, limit=1024)
        try:
            stat = path.stat()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise file_error(e, f"cannot read {path}") from e
        note = read_note(path)
        return note if note is not None and note.describes(stat) else None

    def remove_empty_folder(self, key: str) -> None:
        with contextlib.suppress(OSError):  # not empty, not there: nothing to do
            (self.root / check_output_key(key.rstrip("/"), limit=1024)).rmdir()

    def check_readable(self) -> None:
        try:
            with os.scandir(self.root) as entries:
                next(entries, None)
        except OSError as e:
            raise file_error(e, f"cannot read {self.root}") from e


def file_error(error: OSError, where: str) -> CosyqError:
    """An OSError as StorageUnavailableError (disk full, I/O error) or StorageError (the rest)."""
    cause = error.strerror or str(error)
    if isinstance(error, FileExistsError) and error.errno == errno.EEXIST:
        cause = "a file is in the way (not a directory)"
    if error.errno in _TRANSIENT_ERRNOS:
        return StorageUnavailableError(f"{where}: {cause}")
    return StorageError(f"{where}: {cause}")


_COPY_BLOCK = 1 << 20  # bytes per read when a file is copied into storage


def _writer() -> str:
    """`<host>-<pid>`, in each temp file's name, so a later write can tell a dead writer's."""
    host = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname().split(".")[0]) or "host"
    return f"{host}-{os.getpid()}"


def _write_atomically(path: Path, data: bytes | BinaryIO) -> os.stat_result:
    """Temp file in the same folder, fsync, rename over the target (`data`: bytes, or a file
    copied in blocks); the written file's stat."""
    prefix = f".{path.name}.{_writer()}."
    fd, temp_name = tempfile.mkstemp(dir=path.parent, prefix=prefix, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            if isinstance(data, bytes):
                file.write(data)
            else:
                shutil.copyfileobj(data, file, _COPY_BLOCK)
            file.flush()
            os.fsync(file.fileno())
        os.chmod(temp_name, 0o644)
        written = os.stat(temp_name)
        os.replace(temp_name, path)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    return written


def _write_note(path: Path, written: os.stat_result, metadata: Mapping[str, str]) -> bool:
    """A job's audio or a document's file (its metadata names the job or the document, and the
    sha256): its note beside it, after it is in place. A note not written costs a GET a hash,
    never a wrong answer: any note left there describes another file (shared/audio_notes.py).
    False: no note for this write."""
    job_id, sha256 = metadata.get(JOB_ID_METADATA), metadata.get("sha256")
    document_id = metadata.get(DOCUMENT_ID_METADATA)
    if (job_id is None and document_id is None) or sha256 is None:
        return False
    note = AudioNote.of(written, job_id=job_id or "", sha256=sha256, document_id=document_id or "")
    try:
        _write_atomically(note_path(path), note.encode())
    except OSError as e:
        log.warning("audio_note_unwritten", path=str(path), error=e.strerror or str(e))
    return True


def _remove_stale_temps(path: Path, older_than_s: float) -> None:
    """Temp files of this target that a killed writer (SIGKILL, power loss) left behind."""
    cutoff = time.time() - older_than_s
    head = f".{path.name}."
    me = _writer()
    host = me.rsplit("-", 1)[0]
    for temp in path.parent.glob(f"{glob.escape(head)}*.tmp"):
        writer = temp.name[len(head) :].split(".", 1)[0]
        writer_host, _, pid = writer.rpartition("-")
        dead = writer != me and writer_host == host and pid.isdigit() and not _alive(int(pid))
        with contextlib.suppress(OSError):  # gone already, or not ours to remove
            if dead or temp.stat().st_mtime < cutoff:
                temp.unlink()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


class S3Storage(Storage):
    """An S3-compatible bucket (AWS, MinIO, R2): one PUT per object, atomic by nature."""

    def __init__(self, settings: Settings, bucket: str, prefix: str) -> None:
        super().__init__(settings)
        self.bucket = bucket
        self.prefix = prefix.strip("/")

    @property
    def base_uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    def put(
        self, key: str, data: bytes, content_type: str, metadata: Mapping[str, str]
    ) -> StoredObject:
        full_key = self._full_key(key)
        uri = f"s3://{self.bucket}/{full_key}"
        self._s3.put(
            self.bucket, full_key, data, content_type=content_type, metadata=dict(metadata), uri=uri
        )
        return StoredObject(uri=uri, bytes=len(data))

    def put_file(
        self, key: str, path: Path, content_type: str, metadata: Mapping[str, str]
    ) -> StoredObject:
        full_key = self._full_key(key)
        uri = f"s3://{self.bucket}/{full_key}"
        self._s3.put_file(
            self.bucket, full_key, path, content_type=content_type, metadata=dict(metadata), uri=uri
        )
        return StoredObject(uri=uri, bytes=path.stat().st_size)

    def delete(self, key: str) -> None:
        full_key = self._full_key(key)
        self._s3.delete(self.bucket, full_key, f"s3://{self.bucket}/{full_key}")

    def uri_for(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._full_key(key)}"

    def check_readable(self) -> None:
        self._s3.check_bucket(self.bucket, self.base_uri)

    def job_of(self, key: str) -> str | None:
        """The object's job id metadata."""
        return self._metadata(key).get(JOB_ID_METADATA)

    def document_of(self, key: str) -> str | None:
        """The object's document id metadata."""
        return self._metadata(key).get(DOCUMENT_ID_METADATA)

    def _metadata(self, key: str) -> Mapping[str, str]:
        full_key = self._full_key(key)
        uri = f"s3://{self.bucket}/{full_key}"
        try:
            return self._s3.metadata(self.bucket, full_key, uri)
        except ObjectNotFoundError:
            return {}

    def _full_key(self, key: str) -> str:
        key = check_output_key(key, limit=1024)
        return f"{self.prefix}/{key}" if self.prefix else key


def stored_key(base_uri: str, uri: str) -> str | None:
    """The storage key `uri` names, as `Storage.get` will read it (a file URI's path
    percent-decoded, an S3 key as written); None when it is not one under `base_uri` that a
    storage could have written (another scheme, host or bucket, a path outside the base,
    `..`, `.` or empty segments, a query)."""
    base, parts = urlsplit(base_uri.rstrip("/") + "/"), urlsplit(uri)
    if (parts.scheme, parts.netloc, parts.query, parts.fragment) != (
        base.scheme,
        base.netloc,
        "",
        "",
    ):
        return None
    decoded = unquote if parts.scheme == "file" else str
    base_path, path = decoded(base.path), decoded(parts.path)
    if not path.startswith(base_path):
        return None
    try:
        return check_output_key(path[len(base_path) :], limit=MAX_KEY_CHARS)
    except ValueError:
        return None


def open_storage(settings: Settings) -> Storage:
    """The storage `settings.storage_url` names."""
    parts = urlsplit(settings.storage_url)
    if parts.scheme == "file":
        return FileStorage(settings, Path(unquote(parts.path)))
    if parts.scheme == "s3":
        return S3Storage(settings, parts.netloc, unquote(parts.path))
    raise StorageError(f"COSYQ_STORAGE_URL: unsupported scheme {parts.scheme!r}")
