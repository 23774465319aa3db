"""Text a tenant chose, shown on a terminal (shared/terminal.py, shared/console.py): every
control and bidi override escaped, the console's own styles kept, JSON still the same JSON."""

from __future__ import annotations

import io
import json

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from producer.cli import CliContext
from producer.client import CosyqClient
from producer.commands.webhooks import _print_dead
from shared.console import CommandConsole, EscapingConsole, cell
from shared.settings import load_settings
from shared.terminal import shown

HOSTILE = "\x1b]52;c;cHduZWQ\x1b\\\x1b[2J\x9b2J\u202eab\u2066c\x7fd\x00e"


def test_shown_escapes_controls_and_bidi_and_keeps_tab_and_newline() -> None:
    assert shown("a\tb\nc") == "a\tb\nc"
    assert shown("a\tb\r\nc", one_line=True) == "a\tb\\u000d\\u000ac"
    assert shown("a\u2028b", one_line=True) == "a\\u2028b" and shown("a\u2028b") == "a\u2028b"
    assert shown(HOSTILE) == (
        "\\u001b]52;c;cHduZWQ\\u001b\\\\u001b[2J\\u009b2J\\u202eab\\u2066c\\u007fd\\u0000e"
    )
    assert shown("Grüße, 你好, שלום") == "Grüße, 你好, שלום"  # text, not controls


def test_a_console_prints_a_tenants_text_escaped_and_its_own_styles_as_styles() -> None:
    for console_class in (CommandConsole, EscapingConsole):
        out = io.StringIO()
        console = console_class(file=out, force_terminal=True, width=200, highlight=False)
        console.print(HOSTILE, markup=False)
        table = Table(title="dead webhooks")
        table.add_column("why")
        table.add_row(Text(HOSTILE))
        console.print(table)
        written = out.getvalue()
        assert "\x9b" not in written and "\u202e" not in written
        assert written.count("\\u001b]52;c;cHduZWQ\\u001b") == 2
        assert "\x1b[1m" in written  # the table header's bold, rich's own
        assert "\x1b]" not in written and "\x1b[2J" not in written


def test_json_printed_escaped_reads_back_the_same() -> None:
    """`cosyq result` prints JSON (ensure_ascii off, for readable text): the escapes are JSON's
    own, so a script reading the output gets the value as the tenant wrote it."""
    out = io.StringIO()
    value = {"metadata": {"note": "x\u202ey\x9bz"}, "text": "Grüße"}
    CommandConsole(file=out, width=200).print_json(json.dumps(value, ensure_ascii=False))
    assert "\u202e" not in out.getvalue() and "\x9b" not in out.getvalue()
    assert json.loads(out.getvalue()) == value


def _widths(written: str) -> set[int]:
    """The terminal width of each line of a table printed without styles."""
    return {cell_len(line) for line in written.splitlines() if line.strip()}


def test_a_table_cell_escaped_where_it_is_built_keeps_the_borders_aligned() -> None:
    """rich measures a cell before the console escapes what it writes: a cell escaped only
    then is wider than its column, and its row's border sticks out past the others'."""
    out = io.StringIO()
    table = Table(title="dead webhooks")
    table.add_column("webhook id")
    table.add_column("why")
    table.add_row(cell("a"), cell(HOSTILE))
    table.add_row(cell("b"), cell("[bold]not markup[/bold]"))
    CommandConsole(file=out, width=200).print(table)
    assert len(_widths(out.getvalue().split("\n", 1)[1])) == 1, out.getvalue()  # past the title
    assert "[bold]not markup[/bold]" in out.getvalue()


def test_cosyq_webhooks_failed_table_lines_up_with_a_hostile_reason() -> None:
    out = io.StringIO()
    context = CliContext(
        settings=load_settings(env_file=None),
        make_client=CosyqClient,
        out=CommandConsole(file=out, width=200),
        err=Console(file=io.StringIO()),
    )
    event = {"event": "job.failed", "job_id": "j\x1b[2J1", "url": "https://example.com/hook"}
    _print_dead(context, {"w1": {"event": event, "tries": 3, "dead_reason": HOSTILE}})
    table = out.getvalue().split("\n", 1)[1]  # past the title
    assert len(_widths(table)) == 1, out.getvalue()
    assert "\\u001b]52;c;cHduZWQ" in table and "\x1b" not in table
