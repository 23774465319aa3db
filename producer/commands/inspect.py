"""`cosyq status`, `cosyq failed [--requeue]`, `cosyq result JOB_ID`: look at the queue."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text

from producer.commands.arguments import seconds
from producer.commands.exits import EXIT_CANCELED, EXIT_FAILED, EXIT_NOT_DONE
from producer.monitor import failed_jobs, queue_rows, requeue_failed, worker_rows
from producer.tracking import CANCELED_KIND, status_record
from producer.webhooks.store import WebhookStore
from shared import tenants
from shared.captions import CAPTION_FORMATS, cues_from_pieces, render
from shared.console import cell
from shared.keys import check_job_id
from shared.plurals import counted
from shared.results import SynthesisResult
from shared.start_failures import StartFailure, start_failures

if TYPE_CHECKING:
    from producer.cli import CliContext


def register(subparsers: Any) -> None:
    status = subparsers.add_parser("status", help="queues, workers and recent failures")
    status.add_argument("--failed", type=int, default=10, help="failed jobs to list (default 10)")
    status.set_defaults(handler=run_status)

    failed = subparsers.add_parser("failed", help="list failed jobs; --requeue puts them back")
    failed.add_argument("job_ids", nargs="*", help="only these jobs (default: all)")
    failed.add_argument("--requeue", action="store_true", help="requeue them")
    failed.add_argument("--limit", type=int, default=50, help="jobs to list (default 50)")
    failed.set_defaults(handler=run_failed)

    result = subparsers.add_parser(
        "result",
        help="a job's state and result as JSON",
        description="Print a job's state and result as JSON. Exit status: 0 finished, 1 failed, "
        "2 usage or settings error (a job id is 1-64 letters, digits, '_' or '-'), 3 not done "
        "yet (queued, started, waiting for a retry), 4 no such job (never submitted, or "
        "expired), 5 cannot tell now (Redis unreachable), 6 canceled.",
    )
    result.add_argument("job_id")
    result.add_argument("--wait", type=seconds, default=0.0, help="seconds to wait for it")
    result.add_argument(
        "--captions",
        choices=CAPTION_FORMATS,
        help="print the finished job's captions (one per piece of text) instead of JSON",
    )
    result.set_defaults(handler=run_result)


def _text(value: object) -> Text:
    """A table cell as plain text: rich must not read `[...]` in a reason as markup."""
    return cell("-" if value is None or value == "" else value)


def run_status(args: argparse.Namespace, context: CliContext) -> int:
    with context.make_client(context.settings) as client:
        connection = client.connection
        queue_names = tenants.queue_names(context.settings.tenant_names())
        queues, workers = queue_rows(connection, queue_names), worker_rows(connection)
        cannot_start = start_failures(connection)
        failures = failed_jobs(connection, args.failed, queue_names) if args.failed > 0 else []
        webhooks = WebhookStore(connection).counts()
    context.out.print(f"Redis {context.settings.redacted_redis_url()}", markup=False)
    table = Table(title="queues")
    names = ("queue", "tenant", "queued", "started", "retry wait", "deferred", "finished")
    for index, name in enumerate((*names, "failed")):
        table.add_column(name, justify="left" if index < 2 else "right", overflow="fold")
    for row in queues:
        cells = (row.queued, row.started, row.scheduled, row.deferred, row.finished, row.failed)
        tenant = tenants.tenant_of_queue(row.name)
        table.add_row(cell(row.name), cell(tenant), *(_text(value) for value in cells))
    context.out.print(table)
    table = Table(title=f"workers ({len(workers)})")
    for name in ("worker", "state", "current job", "jobs done", "RSS MB", "backend", "pid"):
        table.add_column(name, overflow="fold")
    for worker in workers:
        backend = "/".join(x for x in (worker.backend, worker.device) if x) or None
        rss = f"{worker.rss_mb:.0f}" if worker.rss_mb is not None else None
        state = worker.state if worker.registered else f"{worker.state} (not in RQ)"
        shown = (state, worker.current_job, worker.jobs_done, rss, backend, worker.pid)
        table.add_row(cell(worker.name), *(_text(value) for value in shown))
    context.out.print(table)
    if cannot_start:
        _print_start_failures(context, cannot_start)
    waiting, dead = webhooks
    if waiting or dead:
        context.out.print(f"webhooks: {waiting} waiting to be delivered, {dead} dead", markup=False)
    _print_failures(context, failures, title=f"recent failures ({len(failures)} shown)")
    return 0


def _print_start_failures(context: CliContext, rows: list[StartFailure]) -> None:
    """Slots whose workers exit before they are ready, and why (plain text: no rich markup)."""
    table = Table(title=f"workers that cannot start ({len(rows)})")
    for name in ("host", "slot", "failures", "last try", "exit", "next try", "reason"):
        table.add_column(name, overflow="fold")
    for row in rows:
        cells = (
            row.slot,
            row.failures or None,
            _clock(row.failed_at),
            row.exit,
            _clock(row.next_start_at),
            row.reason,
        )
        table.add_row(cell(row.host), *(_text(value) for value in cells))
    context.out.print(table)


def _clock(iso: str) -> str | None:
    """An ISO time (UTC) as `YYYY-MM-DD HH:MM:SS`, like the failed jobs' `ended`."""
    return iso[:19].replace("T", " ") if len(iso) >= 19 else None


def _print_failures(context: CliContext, failures: list[Any], title: str) -> None:
    table = Table(title=title)
    for name in ("job", "queue", "ended", "kind", "reason"):
        table.add_column(name, overflow="fold")
    for item in failures:
        ended = item.ended_at.strftime("%Y-%m-%d %H:%M:%S") if item.ended_at else None
        cells = (item.queue, ended, item.failure.kind, item.failure.message)
        table.add_row(cell(item.job_id), *(_text(value) for value in cells))
    context.out.print(table)


def run_failed(args: argparse.Namespace, context: CliContext) -> int:
    for job_id in args.job_ids:
        check_job_id(job_id)
    queue_names = tenants.queue_names(context.settings.tenant_names())
    with context.make_client(context.settings) as client:
        connection = client.connection
        if args.requeue:
            requeued = requeue_failed(connection, args.job_ids or None, queue_names)
            missing = set(args.job_ids) - set(requeued)
            context.out.print(f"requeued {counted(len(requeued), 'job')}", markup=False)
            for job_id in sorted(missing):
                context.err.print(f"{job_id}: not among the failed jobs", markup=False)
            return 1 if missing else 0
        failures = failed_jobs(connection, None if args.job_ids else args.limit, queue_names)
    if args.job_ids:
        failures = [item for item in failures if item.job_id in set(args.job_ids)]
    _print_failures(context, failures, title=f"failed jobs ({len(failures)})")
    return 0


def run_result(args: argparse.Namespace, context: CliContext) -> int:
    """Exit status from producer/commands/exits.py: no such job 4, a bad id 2, Redis down 5."""
    check_job_id(args.job_id)
    with context.make_client(context.settings) as client:
        if args.wait > 0:
            # Errors (failed, timeout) are reported below from the status itself.
            client.wait_many([args.job_id], timeout=args.wait)
        status = client.status(args.job_id)
    if args.captions and status.result is not None:
        return _print_captions(context, status.result, args.captions)
    context.out.print_json(json.dumps(status_record(status), ensure_ascii=False))
    if status.result is not None:
        return 0
    if status.failure is not None and status.failure.kind == CANCELED_KIND:
        return EXIT_CANCELED
    return EXIT_FAILED if status.failure is not None else EXIT_NOT_DONE


def _print_captions(context: CliContext, result: SynthesisResult, fmt: str) -> int:
    if not result.pieces:
        context.err.print(
            f"cosyq: job {result.job_id}: its result has no piece timings (made by a worker "
            "that does not report them)",
            markup=False,
        )
        return EXIT_FAILED
    context.out.file.write(render(cues_from_pieces(result.pieces), fmt))
    return 0
