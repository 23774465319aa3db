"""The line protocol between the pool and each worker it started (one socket pair per worker).

Worker -> pool, one line per event: `loading <worker name>`, `ready`, `retiring <reason>`,
`failed <message>`. Pool -> worker: `retire` (the recycling grant: leave before the next job).
The grant is a message, not a signal, so the worker reads it only between jobs, where no job is
in its hands; SIGTERM from the pool means only "the pool is stopping". A worker started by
launchd or supervisord has no channel and decides alone.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
from dataclasses import dataclass

LOADING = "loading"
READY = "ready"
RETIRING = "retiring"
FAILED = "failed"
WORKER_EVENTS = frozenset({LOADING, READY, RETIRING, FAILED})  # what a worker may say
RETIRE = "retire"
POOL_EVENTS = frozenset({RETIRE})  # what the pool may say
MAX_LINE_CHARS = 1000  # a failure message longer than this is cut (a pipe write stays atomic)
READ_CHUNK = 4096


@dataclass(frozen=True)
class ControlMessage:
    event: str
    detail: str = ""


def encode(event: str, detail: str = "") -> bytes:
    """One message as a single line (newlines in the detail become spaces)."""
    if event not in WORKER_EVENTS | POOL_EVENTS:
        raise ValueError(f"unknown control event {event!r}")
    flat = " ".join(detail.split())[:MAX_LINE_CHARS]
    return f"{event} {flat}".rstrip().encode("utf-8") + b"\n"


def parse(line: bytes, events: frozenset[str] = WORKER_EVENTS) -> ControlMessage | None:
    """A line back into a message; None for anything that is not one of `events`."""
    text = line.decode("utf-8", errors="replace").strip()
    event, _, detail = text.partition(" ")
    if event not in events:
        return None
    return ControlMessage(event=event, detail=detail)


class LineReader:
    """Split whatever arrives on a non-blocking descriptor into messages of `events`."""

    def __init__(self, events: frozenset[str] = WORKER_EVENTS) -> None:
        self.events = events
        self._buffer = b""

    def feed(self, data: bytes) -> list[ControlMessage]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        parsed = (parse(line, self.events) for line in lines)
        return [message for message in parsed if message is not None]


class ControlChannel:
    """The worker's end: its half of the socket pair the pool passed as a file descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.open = True  # False once either side is gone: sends and reads stop
        self._closed = False
        self._reader = LineReader(POOL_EVENTS)
        # A copy of the descriptor to peek through from the housekeeping thread (`pool_gone`)
        # while the main thread reads messages from `fd`.
        self._peek: socket.socket | None = None
        with contextlib.suppress(OSError):  # not a socket (no pool of ours): nothing to peek
            self._peek = socket.socket(fileno=os.dup(fd))
            self._peek.setblocking(False)

    def send(self, event: str, detail: str = "") -> None:
        """Best effort: a pool that has gone away must not break the worker."""
        if not self.open:
            return
        try:
            os.write(self.fd, encode(event, detail))
        except OSError:
            self.open = False

    def receive(self) -> list[ControlMessage]:
        """The pool's messages that arrived so far; never blocks. A closed pool closes this."""
        if not self.open:
            return []
        try:
            readable, _, _ = select.select([self.fd], [], [], 0)
            data = os.read(self.fd, READ_CHUNK) if readable else None
        except OSError:
            data = b""
        if data is None:
            return []
        if not data:  # the pool's end is gone: from now on this worker decides alone
            self.open = False
            return []
        return self._reader.feed(data)

    def pool_gone(self) -> bool:
        """True once the pool's end is closed: the pool exited or was killed. Only the pool
        holds that end (a worker forked from the template, whose parent is the template, sees
        it close as an exec-started one does), and it closes it only after this worker ended.
        Reads nothing: a message still waiting stays for `receive`. Safe from another thread.
        """
        if not self.open:
            return not self._closed  # a send or read saw the pool's end gone; not our close
        if self._peek is None or self._peek.fileno() < 0:
            return False
        # The peer's hang-up, seen even with a message unread (POLLRDHUP: Linux); elsewhere
        # the end shows once nothing is left to read.
        hangup = select.POLLHUP | getattr(select, "POLLRDHUP", 0)
        try:
            poller = select.poll()
            poller.register(self._peek, select.POLLIN | hangup)
            if any(mask & hangup for _, mask in poller.poll(0)):
                return True
            return self._peek.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False  # open, nothing to read
        except (OSError, ValueError):
            return not self._closed  # reset by a pool that died; closed by us meanwhile

    def close(self) -> None:
        self.open = False
        if not self._closed:  # once: the number may belong to another file afterwards
            self._closed = True
            with contextlib.suppress(OSError):
                os.close(self.fd)
            if self._peek is not None:
                self._peek.close()
