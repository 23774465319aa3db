"""`cosyq erase ID... [--document] [--output-key]`: forget jobs or documents now.

Each is canceled if it has not ended, then erased (producer/erasure.py): its stored audio (a
document's segments, file, manifest and captions) at keys cosyq chose, a caller's `output_key`
only with `--output-key`, and its text, result and keys in Redis. One JSON line per id, what
was deleted and kept. The CLI holds Redis and is trusted as an operator: it erases a job or
document of any tenant (or of nobody), where a tenant's key over HTTP erases only its own.
Exit 0 every id erased, 3 one still stopping (erase it again in a moment), 4 one not found
(never made, or erased already), 2 a bad id.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from producer.commands.exits import EXIT_NOT_DONE, EXIT_NOT_FOUND, EXIT_OK
from shared.document_state import DocumentNotFoundError
from shared.errors import JobNotFoundError, StillRunningError
from shared.keys import check_job_id

if TYPE_CHECKING:
    from producer.cli import CliContext


def register(subparsers: Any) -> None:
    erase = subparsers.add_parser(
        "erase",
        help="erase jobs (or documents) now: their stored audio, text and result",
        description="Erase jobs or documents now (canceled first if they have not ended). "
        "Exit status: 0 every one erased, 2 a bad id, 3 one still stopping (erase it again), "
        "4 no such job or document, 5 Redis unreachable.",
    )
    erase.add_argument("ids", nargs="+", metavar="ID")
    erase.add_argument("--document", action="store_true", help="the ids are documents'")
    erase.add_argument(
        "--output-key", action="store_true", help="delete the audio at a caller's output_key too"
    )
    erase.set_defaults(handler=run_erase)


def run_erase(args: argparse.Namespace, context: CliContext) -> int:
    for one in args.ids:
        check_job_id(one)  # every id checked before anything is erased
    status, keep = EXIT_OK, args.output_key
    with context.make_client(context.settings) as client:
        for one in args.ids:
            try:
                if args.document:
                    erasure = client.erase_document(one, output_key=keep, any_tenant=True)
                else:
                    erasure = client.erase(one, output_key=keep, any_tenant=True)
            except (JobNotFoundError, DocumentNotFoundError) as e:
                context.err.print(str(e), markup=False)
                status = max(status, EXIT_NOT_FOUND)
                continue
            except StillRunningError as e:
                context.err.print(str(e), markup=False)
                status = max(status, EXIT_NOT_DONE)
                continue
            context.out.print(json.dumps(erasure.as_json()), markup=False, soft_wrap=True)
    return status
