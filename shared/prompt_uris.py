"""Which prompt audio URIs a request may name, and which of them a worker will read.

`check_prompt_uri` is part of the request gate (producer and worker): a `file://` path or an
`s3://` key gets the structural rules of `output_key` (no `..` or `.` segments, no empty
segments, no backslashes, no control characters) after percent-decoding, since that is how
storage reads it; an S3 bucket must be a valid bucket name. So nothing malformed reaches the
filesystem or boto3.

`PromptRoots` is the worker's own rule (COSYQ_PROMPT_ROOTS): the folders and bucket prefixes it
reads prompt audio from. Any producer can name any URI, so without it a job could make a worker
read any file the worker can. The default is the model directory and the storage URL's prefix,
where `cosyq voices add` uploads recordings. A file is checked where it really is: its path and
the roots with every symlink resolved, so a link under a root that leads outside it (to a file
or a folder) is refused, and one that stays inside is followed.
"""

from __future__ import annotations

import ipaddress
import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from shared.errors import InvalidRequestError
from shared.settings_env import redact_url

PROMPT_URI_SCHEMES = ("file://", "s3://")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_BUCKET_RESERVED_PREFIXES = ("xn--", "sthree-", "amzn-s3-demo-")
_BUCKET_RESERVED_SUFFIXES = ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3")


def check_prompt_uri(uri: str, limit: int = 512) -> str:
    """A prompt audio URI the worker can read: file:///absolute/path or s3://bucket/key.

    Raises ValueError naming the rule; returns the URI unchanged.
    """
    if not uri.startswith(PROMPT_URI_SCHEMES):
        raise ValueError("must be a file:// or s3:// URI")
    if len(uri) > limit:
        raise ValueError(f"{len(uri):,} characters, limit {limit:,}")
    _check_characters(uri)
    if "?" in uri or "#" in uri:
        raise ValueError("'?' and '#' are not allowed (a query or fragment is not part of a path)")
    parts = urlsplit(uri)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError("a file URI needs an absolute path: file:///path/to/prompt.wav")
        path = unquote(parts.path)
        if not path.startswith("/"):
            raise ValueError("a file URI needs an absolute path: file:///path/to/prompt.wav")
        _check_characters(path)
        _check_segments(path[1:])
    else:
        bucket, _, key = uri[len("s3://") :].partition("/")
        if not bucket or not key:
            raise ValueError("an s3 URI needs a bucket and a key: s3://bucket/key")
        check_bucket_name(bucket)
        _check_segments(key)
    return uri


def check_bucket_name(bucket: str) -> str:
    """S3's general-purpose bucket naming rules; ValueError naming the one broken."""
    if not _BUCKET_RE.fullmatch(bucket):
        raise ValueError(
            "bucket: 3-63 lowercase letters, digits, '.' or '-', starting and ending with a "
            "letter or digit"
        )
    if ".." in bucket or ".-" in bucket or "-." in bucket:
        raise ValueError("bucket: no '..', '.-' or '-.' in a bucket name")
    if _is_ip_address(bucket):
        raise ValueError("bucket: must not look like an IP address")
    if bucket.startswith(_BUCKET_RESERVED_PREFIXES) or bucket.endswith(_BUCKET_RESERVED_SUFFIXES):
        raise ValueError("bucket: uses a prefix or suffix S3 reserves")
    return bucket


def _check_characters(text: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"not valid UTF-8 (unpaired surrogate at character {e.start})") from e
    control = _CONTROL_RE.search(text)
    if control:
        raise ValueError(f"contains control character U+{ord(control.group()):04X}")


def _check_segments(path: str) -> None:
    """output_key's structural rules for the part after the root or the bucket."""
    if "\\" in path:
        raise ValueError("backslashes are not allowed")
    segments = path.split("/")
    if any(segment in ("..", ".") for segment in segments):
        raise ValueError("'..' and '.' segments are not allowed")
    if any(segment == "" for segment in segments):
        raise ValueError("empty segments ('//' or a trailing '/') are not allowed")


def _is_ip_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class PromptRoots:
    """Folders (`/abs/path`) and bucket prefixes (`s3://bucket/prefix`) prompts may come from."""

    roots: tuple[str, ...]

    @classmethod
    def from_values(
        cls, prompt_roots: str | None, *, storage_url: str, model_dir: Path | None
    ) -> PromptRoots:
        """COSYQ_PROMPT_ROOTS (comma-separated URIs), else the model dir and storage prefix."""
        if prompt_roots is not None:
            uris = [part.strip() for part in prompt_roots.split(",") if part.strip()]
        else:
            uris = [storage_url]
            if model_dir is not None:
                uris.append(Path(os.path.abspath(model_dir)).as_uri())
        return cls(tuple(prompt_root(uri) for uri in uris))

    def check(self, uri: str, *, field: str = "prompt_audio") -> None:
        """InvalidRequestError unless `uri` (already through check_prompt_uri) is under a root,
        for a file with its symlinks and the roots' resolved (where the read will land)."""
        place = _place(uri)
        if not any(_under(place, root) for root in self.roots):
            raise InvalidRequestError(
                f"{field}: {uri} is outside the folders this worker reads prompts from "
                "(COSYQ_PROMPT_ROOTS)"
            )
        if place.startswith("/"):
            real = os.path.realpath(place)
            folders = (os.path.realpath(root) for root in self.roots if root.startswith("/"))
            if not any(_under(real, folder) for folder in folders):
                raise InvalidRequestError(  # the target is not named: it is not the user's
                    f"{field}: {uri} is a symlink, or under one, that leads outside the folders "
                    "this worker reads prompts from (COSYQ_PROMPT_ROOTS)"
                )


def prompt_root(uri: str) -> str:
    """One root in the form kept for comparison; ValueError for anything but a folder or bucket."""
    parts = urlsplit(uri)
    if parts.scheme == "file" and parts.netloc in ("", "localhost") and parts.path.startswith("/"):
        return posixpath.normpath("/" + unquote(parts.path).lstrip("/"))
    if parts.scheme == "s3" and parts.netloc and "@" not in parts.netloc:  # no credentials
        prefix = posixpath.normpath("/" + parts.path.lstrip("/")).rstrip("/")
        return f"s3://{parts.netloc}{prefix}"
    raise ValueError(f"{redact_url(uri)!r} is not a file:///folder or s3://bucket[/prefix] URI")


def _under(place: str, root: str) -> bool:
    return place == root or place.startswith(root.rstrip("/") + "/")


def _place(uri: str) -> str:
    """A checked prompt URI in the form roots are kept in."""
    parts = urlsplit(uri)
    if parts.scheme == "file":
        return unquote(parts.path)
    return f"s3://{parts.netloc}{parts.path}"
