"""`cosyq voices list|add|rm`: registered voices (prompt features computed by a worker).

The CLI holds Redis, so it is trusted: `--shared` adds or removes a shared voice (usable by
every tenant, changed by no tenant key); without it, the voices of the client's tenant
("default")."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from producer.commands.arguments import seconds
from shared.console import cell
from shared.errors import InvalidRequestError
from shared.voices import VoiceSummary

if TYPE_CHECKING:
    from producer.cli import CliContext

TRANSCRIPT_SHOWN_CHARS = 60


def register(subparsers: Any) -> None:
    voices = subparsers.add_parser("voices", help="list, add and remove voices")
    commands = voices.add_subparsers(dest="voices_command", required=True, metavar="COMMAND")

    listing = commands.add_parser("list", help="registered voices")
    listing.set_defaults(handler=run_list)

    add = commands.add_parser(
        "add",
        help="register a voice from a prompt recording (a worker computes its features)",
        description="Upload a prompt recording (any format soundfile reads, at least 16 kHz, "
        "at most COSYQ_MAX_PROMPT_SECONDS) and have a worker turn it into a voice that jobs "
        'name with --voice / "voice". Adding an existing name replaces it.',
    )
    add.add_argument("name", help="1-64 letters, digits, '_', '.' or '-'")
    add.add_argument("audio", type=Path, help="the prompt recording")
    add.add_argument(
        "--text", default="", help="what the recording says (needed by mode zero_shot)"
    )
    add.add_argument(
        "--shared", action="store_true", help="a shared voice: every tenant may use it"
    )
    add.add_argument("--no-wait", action="store_true", help="print the job id and return")
    add.add_argument("--timeout", type=seconds, help="seconds to wait (COSYQ_WAIT_TIMEOUT_S)")
    add.set_defaults(handler=run_add)

    remove = commands.add_parser("rm", help="remove a voice")
    remove.add_argument("name")
    remove.add_argument("--shared", action="store_true", help="remove the shared voice")
    remove.set_defaults(handler=run_remove)


def _shorten(text: str) -> str:
    if len(text) <= TRANSCRIPT_SHOWN_CHARS:
        return text or "-"
    return text[: TRANSCRIPT_SHOWN_CHARS - 3] + "..."


def _table(voices: list[VoiceSummary], title: str) -> Table:
    table = Table(title=title)
    columns = ("voice", "tokens", "seconds", "source Hz", "model", "family", "checkpoint")
    for column in (*columns, "created"):
        table.add_column(column, overflow="fold")
    table.add_column("transcript", overflow="fold")
    for voice in voices:
        cells = (
            voice.name + (" (shared)" if voice.shared else ""),
            str(voice.speech_tokens),
            f"{voice.source_seconds:.2f}",
            str(voice.source_sample_rate),
            voice.model_name,
            voice.family,
            voice.checkpoint_hash,
            voice.created_at,
            _shorten(voice.transcript),
        )
        table.add_row(*(cell(value) for value in cells))  # "[laughter]" is a tag, not markup
    return table


def run_list(args: argparse.Namespace, context: CliContext) -> int:
    with context.make_client(context.settings) as client:
        voices = client.list_voices()
    context.out.print(_table(voices, f"voices ({len(voices)})"))
    return 0


def run_add(args: argparse.Namespace, context: CliContext) -> int:
    try:
        audio = args.audio.read_bytes()
    except OSError as e:
        raise InvalidRequestError(f"{args.audio}: cannot read ({e.strerror})") from e
    with context.make_client(context.settings) as client:
        job_id = client.add_voice(
            args.name, audio, args.text, filename=args.audio.name, shared=args.shared
        )
        if args.no_wait:
            context.out.print(job_id, markup=False)
            return 0
        with context.err.status(f"computing voice {args.name} (job {job_id})"):
            summary = client.wait_for_voice(job_id, timeout=args.timeout)
    verb = "replaced" if summary.replaced else "added"  # another add of this name came first
    context.out.print(_table([summary], f"{verb} voice {summary.name} (job {job_id})"))
    return 0


def run_remove(args: argparse.Namespace, context: CliContext) -> int:
    with context.make_client(context.settings) as client:
        client.remove_voice(args.name, shared=args.shared)
    shown = "shared voice" if args.shared else "voice"
    context.out.print(f"removed {shown} {args.name}", markup=False)
    return 0
