"""The rich console a command writes its output (stdout) to, and what a closed stdout means.

rich's own `Console.on_broken_pipe` exits 1 at once when the reader of stdout goes away
(`cosyq status | head -c1`), mid-command: `cosyq submit many.jsonl | head -1` would stop after
its first chunk and report failure after submitting part of the file. `CommandConsole` instead
stops writing quietly and lets the command finish its work; the entry point then exits
`EXIT_BROKEN_PIPE` (141, 128 + SIGPIPE, as `cat` in `| head`) where it would have exited 0.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console

EXIT_BROKEN_PIPE = 128 + 13  # SIGPIPE


def point_stdout_at_devnull() -> None:
    """Stdout's reader is gone: later writes and the interpreter's last flush go nowhere,
    so no `BrokenPipeError` traceback is printed at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout has no file descriptor (captured by a test)
        pass
    finally:
        os.close(devnull)


class CommandConsole(Console):
    """A command's stdout; `closed` once its reader went away (nothing is written after)."""

    closed = False

    def on_broken_pipe(self) -> None:
        self.quiet = True
        self.closed = True
        point_stdout_at_devnull()

    def flush_output(self) -> None:
        """Flush what was printed so far (ids a caller reads as they come)."""
        try:
            self.file.flush()
        except BrokenPipeError:
            self.on_broken_pipe()

    def exit_status(self, status: int) -> int:
        """The command's status, or 141 for a success whose output was cut off."""
        return EXIT_BROKEN_PIPE if self.closed and status == 0 else status
