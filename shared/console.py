"""The rich console a command writes its output (stdout) to, and what a closed stdout means.

rich's own `Console.on_broken_pipe` exits 1 at once when the reader of stdout goes away
(`cosyq status | head -c1`), mid-command: `cosyq submit many.jsonl | head -1` would stop after
its first chunk and report failure after submitting part of the file. `CommandConsole` instead
stops writing quietly and lets the command finish its work; the entry point then exits
`EXIT_BROKEN_PIPE` (141, 128 + SIGPIPE, as `cat` in `| head`) where it would have exited 0.

Everything it prints passes `shared.terminal.shown`: a tenant's text in a table cell, an error
message or JSON (a webhook receiver's error answer, say) reaches the operator's terminal with
its escape sequences and bidi overrides written out, never obeyed. rich itself drops only BEL,
BS, VT, FF and CR; ESC it writes as is. A table's cells are escaped where the table is built
(`cell`), before rich measures them, so its borders line up.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable

from rich.console import Console
from rich.segment import Segment
from rich.text import Text

from shared.terminal import shown

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


def cell(value: object) -> Text:
    """A table cell holding text a tenant chose: plain text (never markup: "[laughter]" is a
    tag), escaped (`shown`) before rich measures it. Escaped only as it is written, an ESC (no
    width to rich) became `\\u001b`, six characters rich never laid out, and the row's border
    moved right of the others'."""
    return Text(shown(str(value)))


class EscapingConsole(Console):
    """A console whose printed text is escaped for the terminal (`shared.terminal.shown`);
    its own styles and cursor controls (rich's control segments) are not."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        # rich's one place where segments become the characters written (styles added here)
        return super()._render_buffer(
            segment if segment.control else Segment(shown(segment.text), segment.style)
            for segment in buffer
        )


class CommandConsole(EscapingConsole):
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
