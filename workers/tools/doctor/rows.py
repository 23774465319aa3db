"""One doctor row: a check's verdict (✓, ✗ or skipped), what it found, and how to fix a ✗.

Why a plain record: the same rows are printed as a table for a person and as JSON for a
problem report, and the exit status is computed from them alone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

COREML_ONLY_ON_MACOS = "Core ML runs only on macOS (conversion works here)"


class Status(StrEnum):
    OK = "ok"
    FAIL = "fail"
    SKIP = "skipped"


@dataclass(frozen=True)
class Row:
    """A check's outcome. A ✗ on a row that is not `required` is advice: it never sets exit 1."""

    group: str  # "host", "stack", "services", "model", "run"
    name: str
    status: Status
    detail: str = ""  # what was found (ok, fail) or why it was skipped
    hint: str = ""  # one line: how to fix a ✗
    required: bool = True
    figures: dict[str, Any] | None = None  # numbers behind the row, for --json

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["status"] = self.status.value
        if self.figures is None:
            del data["figures"]
        return data

    @property
    def fails(self) -> bool:
        """True when this row makes the command exit 1."""
        return self.status is Status.FAIL and self.required


def ok(group: str, name: str, detail: str, **figures: Any) -> Row:
    return Row(group, name, Status.OK, detail, figures=figures or None)


def fail(group: str, name: str, detail: str, hint: str, *, required: bool = True) -> Row:
    if not hint:
        raise ValueError(f"row {name!r}: every ✗ needs a fix hint")
    return Row(group, name, Status.FAIL, detail, hint, required)


def skip(group: str, name: str, why: str) -> Row:
    return Row(group, name, Status.SKIP, why)


def exit_status(rows: list[Row]) -> int:
    """0 when every required check passed (or was skipped), else 1."""
    return 1 if any(row.fails for row in rows) else 0


def one_line(error: BaseException) -> str:
    """An exception as one line: its text, else its type's name."""
    return " ".join(str(error).split()) or type(error).__name__
