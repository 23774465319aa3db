"""The line protocol between the pool and each worker it started (one pipe per worker).

Worker -> pool, one line per event: `loading <worker name>`, `ready`, `retiring <reason>`,
`failed <message>`. Pool -> worker: signals only (SIGTERM = finish the current job and exit).
A worker started by launchd or supervisord has no channel and decides alone.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

LOADING = "loading"
READY = "ready"
RETIRING = "retiring"
FAILED = "failed"
EVENTS = (LOADING, READY, RETIRING, FAILED)
MAX_LINE_CHARS = 1000  # a failure message longer than this is cut (a pipe write stays atomic)


@dataclass(frozen=True)
class ControlMessage:
    event: str
    detail: str = ""


def encode(event: str, detail: str = "") -> bytes:
    """One message as a single line (newlines in the detail become spaces)."""
    if event not in EVENTS:
        raise ValueError(f"unknown control event {event!r}")
    flat = " ".join(detail.split())[:MAX_LINE_CHARS]
    return f"{event} {flat}".rstrip().encode("utf-8") + b"\n"


def parse(line: bytes) -> ControlMessage | None:
    """A line back into a message; None for anything that is not one."""
    text = line.decode("utf-8", errors="replace").strip()
    event, _, detail = text.partition(" ")
    if event not in EVENTS:
        return None
    return ControlMessage(event=event, detail=detail)


class ControlChannel:
    """The worker's end: the write side of a pipe the pool passed as a file descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.open = True

    def send(self, event: str, detail: str = "") -> None:
        """Best effort: a pool that has gone away must not break the worker."""
        if not self.open:
            return
        try:
            os.write(self.fd, encode(event, detail))
        except OSError:
            self.open = False

    def close(self) -> None:
        if self.open:
            self.open = False
            with contextlib.suppress(OSError):
                os.close(self.fd)


class LineReader:
    """The pool's end: split whatever arrives on a non-blocking pipe into messages."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[ControlMessage]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        return [message for message in (parse(line) for line in lines) if message is not None]
