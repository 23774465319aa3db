"""Can this process use its storage? Write, read back and delete a small probe object.

Why: a wrong COSYQ_STORAGE_URL (a file where a folder should be, a read-only mount, no such
bucket, wrong keys) otherwise shows only after a job's synthesis, as the failure of every job.
The worker waits for a settled probe before it reports ready (`wait_for_storage`: transient
failures retried with backoff up to COSYQ_STORAGE_PROBE_WAIT_S); `cosyq-worker doctor` and the
HTTP front's /readyz call `probe_configured_storage` (or `probe_storage`) for one verdict. No
secret appears in an outcome.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Literal
from urllib.parse import urlsplit

from shared.errors import CosyqError, StorageUnavailableError
from shared.settings import Settings, redact_url
from shared.storage import Storage, open_storage
from shared.storage_retry import Backoff

PROBE_PREFIX = ".cosyq-probe-"  # probe objects sit at the top of the prefix, no folder made
_UNSAFE_KEY_CHARS = re.compile(r"[^A-Za-z0-9._-]")


class Verdict(StrEnum):
    OK = "ok"
    PERMANENT = "permanent"  # will not fix itself: exit, fix the configuration
    TRANSIENT = "transient"  # may pass: wait and probe again


@dataclass(frozen=True)
class ProbeOutcome:
    """One probe's verdict; `url` is the storage URL with secrets masked."""

    verdict: Verdict
    url: str
    cause: str = ""  # one line; empty when ok
    warning: str = ""  # ok, but worth saying (the probe object could not be deleted)
    attempts: int = 1
    elapsed_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK

    @property
    def line(self) -> str:
        """One line for a log, an exit message or a health check."""
        if self.ok:
            return f"storage {self.url}: ok" + (f" ({self.warning})" if self.warning else "")
        return f"storage {self.url} is not usable ({self.verdict.value}): {self.cause}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict.value,
            "url": self.url,
            "cause": self.cause,
            "warning": self.warning,
            "attempts": self.attempts,
            "elapsed_s": round(self.elapsed_s, 3),
        }


def masked_url(url: str) -> str:
    """A storage URL fit to show: any password replaced, query and fragment dropped."""
    parts = urlsplit(redact_url(url))
    return parts._replace(query="", fragment="").geturl()


def probe_key() -> str:
    """A key no other process uses: `.cosyq-probe-<host>-<pid>-<random>.txt`."""
    host = _UNSAFE_KEY_CHARS.sub("_", socket.gethostname().split(".")[0]) or "host"
    return f"{PROBE_PREFIX}{host}-{os.getpid()}-{os.urandom(4).hex()}.txt"


def probe_storage(storage: Storage, *, mode: Literal["write", "read"] = "write") -> ProbeOutcome:
    """One probe. `write`: put, read back, compare, delete. `read`: the prefix can be read."""
    url = masked_url(storage.base_uri)
    started = time.monotonic()
    try:
        if mode == "read":
            storage.check_readable()
            warning = ""
        else:
            warning = _round_trip(storage)
    except Exception as e:
        return ProbeOutcome(
            _verdict_of(e), url, cause=_one_line(e), elapsed_s=time.monotonic() - started
        )
    return ProbeOutcome(Verdict.OK, url, warning=warning, elapsed_s=time.monotonic() - started)


def probe_configured_storage(
    settings: Settings, *, mode: Literal["write", "read"] = "write"
) -> ProbeOutcome:
    """`probe_storage` of the storage COSYQ_STORAGE_URL names; never raises."""
    try:
        storage = open_storage(settings)
    except CosyqError as e:
        url = masked_url(settings.storage_url)
        return ProbeOutcome(Verdict.PERMANENT, url, cause=_one_line(e))
    return probe_storage(storage, mode=mode)


def wait_for_storage(
    storage: Storage,
    *,
    wait_s: float,
    backoff: Backoff,
    on_retry: Callable[[ProbeOutcome, float], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> ProbeOutcome:
    """Probe until the verdict is ok or permanent, or transient failures outlast `wait_s`."""
    started = clock()
    attempt = 0
    while True:
        attempt += 1
        outcome = probe_storage(storage)
        elapsed = clock() - started
        outcome = replace(outcome, attempts=attempt, elapsed_s=elapsed)
        if outcome.verdict is not Verdict.TRANSIENT:
            return outcome
        delay = backoff.delay_s(attempt)
        if elapsed + delay > wait_s:
            gave_up = f"{outcome.cause} (still failing after {attempt} tries in {elapsed:.1f} s)"
            return replace(outcome, cause=gave_up)
        if on_retry is not None:
            on_retry(outcome, delay)
        sleep(delay)


def _round_trip(storage: Storage) -> str:
    """Write, read back, delete; returns a warning when only the delete failed."""
    key = probe_key()
    body = f"cosyq storage probe {os.urandom(8).hex()}\n".encode()
    stored = storage.put(key, body, "text/plain", {"cosyq-probe": "1"})
    try:
        read_back = storage.get(stored.uri)
    except CosyqError as e:
        _delete_quietly(storage, key)
        raise _ReadBackError(f"wrote {stored.uri} but cannot read it back: {e}") from e
    if read_back != body:
        _delete_quietly(storage, key)
        raise _ReadBackError(f"read back {stored.uri}: {len(read_back)} bytes differ from written")
    try:
        storage.delete(key)
    except CosyqError as e:
        return f"probe object left behind: {e}"
    return ""


def _delete_quietly(storage: Storage, key: str) -> None:
    with contextlib.suppress(CosyqError):  # the read-back failure is the news
        storage.delete(key)


class _ReadBackError(CosyqError):
    """The probe object was written but did not come back as written."""


def _verdict_of(error: BaseException) -> Verdict:
    cause = error.__cause__
    if isinstance(error, StorageUnavailableError):
        return Verdict.TRANSIENT
    if isinstance(error, _ReadBackError) and isinstance(cause, StorageUnavailableError):
        return Verdict.TRANSIENT
    return Verdict.PERMANENT


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    if not isinstance(error, CosyqError):
        return f"{type(error).__name__}: {text}" if text else type(error).__name__
    return text or type(error).__name__
