"""What `cosyq submit --wait` leaves behind: the --results file, written as outcomes arrive,
and the summary, which tells finished jobs from those still queued or running.

The results file gets one JSON line per submitted line as soon as its job ends (in the order
jobs end, each naming its line), so a client that is killed leaves a usable file; lines still
pending when the wait ends are written last with status "pending". The job ids themselves were
printed as they were submitted.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from rich.table import Table

from producer.tracking import CANCELED_KIND, PENDING_KIND, JobOutcome
from shared.plurals import counted
from shared.results import JobFailure, SynthesisResult

if TYPE_CHECKING:
    from producer.cli import CliContext

MAX_FAILURES_SHOWN = 20


def is_pending(outcome: JobOutcome) -> bool:
    return isinstance(outcome, JobFailure) and outcome.kind == PENDING_KIND


def is_canceled(outcome: JobOutcome) -> bool:
    return isinstance(outcome, JobFailure) and outcome.kind == CANCELED_KIND


def record(line: int, job_id: str, outcome: JobOutcome) -> dict[str, Any]:
    """One results-file line: the full result, the failure, "canceled" or "pending"."""
    data: dict[str, Any] = {"line": line, "job_id": job_id}
    if isinstance(outcome, SynthesisResult):
        data.update(status="ok", result=outcome.model_dump(mode="json"))
    elif is_pending(outcome):
        data.update(status="pending", error=outcome.as_meta())
    elif is_canceled(outcome):
        data.update(status="canceled", error=outcome.as_meta())
    else:
        data.update(status="failed", error=outcome.as_meta())
    return data


class ResultsFile:
    """--results, appended and flushed one outcome at a time."""

    def __init__(self, path: Path, line_numbers: Sequence[int], job_ids: Sequence[str]) -> None:
        self.lines: dict[str, list[int]] = defaultdict(list)  # an idempotent id: many lines
        for number, job_id in zip(line_numbers, job_ids, strict=True):
            self.lines[job_id].append(number)
        self.written: set[str] = set()
        self.file = path.open("w", encoding="utf-8")

    def __enter__(self) -> ResultsFile:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.file.close()

    def write(self, job_id: str, outcome: JobOutcome) -> None:
        if job_id in self.written:
            return
        self.written.add(job_id)
        for number in self.lines[job_id]:
            self.file.write(json.dumps(record(number, job_id, outcome), ensure_ascii=False) + "\n")
        self.file.flush()

    def write_rest(self, outcomes: dict[str, JobOutcome]) -> None:
        """The jobs not reported as they ended (still pending at the deadline)."""
        for job_id in self.lines:
            if job_id in outcomes:
                self.write(job_id, outcomes[job_id])


def quality_counts(results: Sequence[SynthesisResult]) -> tuple[int, int]:
    """(results stored flagged suspect, re-syntheses of suspect audio) over `results`."""
    reports = [r.quality for r in results if r.quality is not None]
    return sum(q.verdict == "suspect" for q in reports), sum(q.retries for q in reports)


@dataclass(frozen=True)
class Tally:
    """Distinct jobs by how they ended: failed, canceled (`cosyq cancel`), still pending."""

    failed: int
    canceled: int
    pending: int


def print_summary(
    context: CliContext,
    line_numbers: Sequence[int],
    job_ids: Sequence[str],
    outcomes: dict[str, JobOutcome],
    wall_s: float,
) -> Tally:
    """Failures (with line numbers), then the table; returns the tally of jobs not ok.

    Rates are over finished jobs: a job still queued or running is neither done nor failed;
    a canceled job is counted apart from failed ones.
    """
    unique = [outcomes[j] for j in dict.fromkeys(job_ids)]
    results = [o for o in unique if isinstance(o, SynthesisResult)]
    tally = Tally(
        failed=len(unique) - len(results) - sum(is_pending(o) or is_canceled(o) for o in unique),
        canceled=sum(is_canceled(o) for o in unique),
        pending=sum(is_pending(o) for o in unique),
    )
    _print_failures(context, line_numbers, job_ids, outcomes)
    if tally.pending:
        context.err.print(
            f"{counted(tally.pending, 'job')} still queued or running when the wait ended: left "
            "queued, to run later (cosyq result JOB_ID)",
            markup=False,
        )
    context.out.print(_table(results, tally, wall_s))
    return tally


def _print_failures(
    context: CliContext,
    line_numbers: Sequence[int],
    job_ids: Sequence[str],
    outcomes: dict[str, JobOutcome],
) -> None:
    failures = [
        (number, j, o)
        for number, j in zip(line_numbers, job_ids, strict=True)
        if isinstance(o := outcomes[j], JobFailure) and not is_pending(o) and not is_canceled(o)
    ]
    for number, job_id, failure in failures[:MAX_FAILURES_SHOWN]:
        context.err.print(
            f"line {number} (job {job_id}) failed: {failure.kind}: {failure.message}",
            markup=False,
        )
    if len(failures) > MAX_FAILURES_SHOWN:
        more = len(failures) - MAX_FAILURES_SHOWN
        context.err.print(f"... and {counted(more, 'more failure')}", markup=False)


def _table(results: list[SynthesisResult], tally: Tally, wall_s: float) -> Table:
    audio_s = sum(result.duration_s for result in results)
    finished = len(results) + tally.failed + tally.canceled
    table = Table(title="cosyq submit")
    columns = ("ok", "suspect", "quality retries", "failed", "canceled", "still running")
    for column in (*columns, "audio s", "wall s", "audio s / wall s", "finished jobs / s"):
        table.add_column(column, justify="right")
    suspect, retries = quality_counts(results)
    table.add_row(
        str(len(results)),
        str(suspect),
        str(retries),
        str(tally.failed),
        str(tally.canceled),
        str(tally.pending),
        f"{audio_s:.2f}",
        f"{wall_s:.2f}",
        f"{audio_s / wall_s:.2f}" if wall_s > 0 else "-",
        f"{finished / wall_s:.2f}" if wall_s > 0 else "-",
    )
    return table
