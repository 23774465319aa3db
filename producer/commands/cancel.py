"""`cosyq cancel JOB_ID...`: a waiting job never runs, a running one stops at its next step.

One line per job, saying what happened; exit 0 when every job is canceled or stopping (or was
canceled already), 1 when one had already finished or failed (nothing changed for it), 4 when
one does not exist, 2 for an id that cannot be one.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from producer.commands.exits import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK
from shared.errors import JobNotFoundError
from shared.keys import check_job_id

if TYPE_CHECKING:
    from producer.cli import CliContext


def register(subparsers: Any) -> None:
    cancel = subparsers.add_parser(
        "cancel",
        help="cancel jobs: queued ones never run, running ones stop at their next step",
        description="Cancel jobs. Exit status: 0 every job canceled (or stopping, or already "
        "canceled), 1 a job had already finished or failed (left as it was), 2 a bad job id, "
        "4 no such job, 5 Redis unreachable.",
    )
    cancel.add_argument("job_ids", nargs="+", metavar="JOB_ID")
    cancel.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="a retry with the same key says what the first try did (canceled, not "
        "already canceled, when its answer was lost)",
    )
    cancel.set_defaults(handler=run_cancel)


def run_cancel(args: argparse.Namespace, context: CliContext) -> int:
    for job_id in args.job_ids:
        check_job_id(job_id)  # every id checked before any job is touched
    status = EXIT_OK
    with context.make_client(context.settings) as client:
        for job_id in args.job_ids:
            try:
                outcome = client.cancel(job_id, idempotency_key=args.idempotency_key)
            except JobNotFoundError as e:
                context.err.print(str(e), markup=False)
                status = max(status, EXIT_NOT_FOUND)
                continue
            context.out.print(outcome.describe(), markup=False)
            if outcome.verdict == "already_ended":
                status = max(status, EXIT_FAILED)
    return status
