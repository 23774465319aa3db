"""Print doctor's rows: a rich table for a person, or JSON for a script or a problem report.

The JSON carries every row (with the figures behind it) and the exit status, so a report
attached to an issue says as much as the table, and more.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TextIO

from rich.table import Table

from shared.console import CommandConsole, point_stdout_at_devnull
from workers.tools.doctor.rows import Row, Status, exit_status

JSON_FORMAT = 1
MARKS = {Status.OK: "[green]✓[/]", Status.FAIL: "[red]✗[/]", Status.SKIP: "[dim]–[/]"}


def _cosyq_version() -> str:
    try:
        return version("cosyq")
    except PackageNotFoundError:
        return "unknown"


def as_json(rows: list[Row]) -> dict[str, Any]:
    return {
        "format": JSON_FORMAT,
        "cosyq": _cosyq_version(),
        "created_utc": datetime.now(UTC).isoformat(timespec="seconds"),
        "platform": f"{sys.platform} {platform.machine()}",
        "cpus": os.cpu_count(),
        "load_average": [round(v, 2) for v in os.getloadavg()],  # timings are noisy when high
        "exit_status": exit_status(rows),
        "rows": [row.as_dict() for row in rows],
    }


def print_json(rows: list[Row], out: TextIO | None = None) -> bool:
    """The report as JSON; True when stdout's reader went away (nothing more is written)."""
    file = out or sys.stdout
    try:
        print(json.dumps(as_json(rows), indent=2, allow_nan=False), file=file)
        file.flush()
    except BrokenPipeError:
        point_stdout_at_devnull()
        return True
    return False


def print_table(rows: list[Row], out: TextIO | None = None) -> bool:
    """The report as tables; True when stdout's reader went away (nothing more is written)."""
    console = CommandConsole(file=out or sys.stdout, width=_width(), highlight=False)
    table = Table(title="cosyq-worker doctor", show_lines=False, expand=True)
    table.add_column("group", style="bold", no_wrap=True)
    table.add_column("check", no_wrap=True)
    table.add_column("", no_wrap=True)
    table.add_column("result", ratio=1)
    for row in rows:
        table.add_row(row.group, row.name, MARKS[row.status], _result(row))
    console.print(table)
    seed = seed_rows(rows)
    if seed:
        console.print(_seed_table(seed))
        console.print(_stage_table(seed))
    failed = [row for row in rows if row.fails]
    advice = [row for row in rows if row.status is Status.FAIL and not row.required]
    if failed:
        console.print(f"[red]{len(failed)} required check(s) failed[/]: exit 1")
    else:
        note = f" ({len(advice)} piece(s) of advice above)" if advice else ""
        console.print(f"[green]every required check passed[/]{note}: exit 0")
    console.flush_output()
    return console.closed


def _width() -> int | None:
    """Wide enough for one row per line when the output is not a terminal (a log, a file)."""
    return None if sys.stdout.isatty() else 160


def _result(row: Row) -> str:
    text = _escape(row.detail)
    if row.status is Status.SKIP:
        return f"[dim]skipped: {text}[/]"
    if row.status is Status.FAIL:
        advice = "" if row.required else " [yellow](advice: does not fail the command)[/]"
        return f"{text}{advice}\n[bold]fix:[/] {_escape(row.hint)}"
    return text


def _escape(text: str) -> str:
    return text.replace("[", r"\[")


def seed_rows(rows: list[Row]) -> list[dict[str, Any]]:
    """The run rows' figures (one per backend that ran)."""
    return [row.figures for row in rows if row.figures is not None and "stages" in row.figures]


def _seed_table(figures: list[dict[str, Any]]) -> Table:
    load = os.getloadavg()[0]
    title = f"the seed's table, on this machine (load average {load:.2f}, {os.cpu_count()} CPUs)"
    table = Table(title=title)
    for column in (
        "backend",
        "model load s",
        "first inference s",
        "mean inference s",
        "peak RSS GB",
    ):
        table.add_column(column, justify="left" if column == "backend" else "right")
    for f in figures:
        table.add_row(
            f["backend"],
            f"{f['load_s']:.2f}",
            f"{f['first_inference_s']:.3f}",
            f"{f['mean_inference_s']:.3f}",
            f"{f['peak_rss_gb']:.2f}",
        )
    return table


def _stage_table(figures: list[dict[str, Any]]) -> Table:
    table = Table(title="per stage, identical inputs, against torch-cpu fp32")
    for column in ("backend", "stage", "best ms", "max |error|", "SNR dB"):
        table.add_column(column, justify="left" if column in ("backend", "stage") else "right")
    for f in figures:
        for stage in f["stages"]:
            snr = stage["snr_db"]
            table.add_row(
                f["backend"],
                stage["stage"],
                f"{stage['seconds'] * 1e3:.1f}",
                f"{stage['max_abs_error']:.3g}",
                "identical" if snr is None else f"{snr:.1f}",
            )
    return table
