"""`cosyq document submit|status|retry|cancel|result|backfill-records`: long texts as one
file with captions.

`submit FILE --out chapter.mp3` splits FILE into segments, enqueues them, shows a progress bar
(segments done, audio seconds so far), then writes chapter.mp3, chapter.srt, chapter.vtt and
the manifest chapter.json; `--no-wait` prints the document id and returns. `result ID --out`
fetches a finished one; `retry ID` reruns only the failed (or lost) segments.
`backfill-records` (an operator's, once after an upgrade) writes the segments' record of every
live document submitted before records existed (producer/segment_records.py) and the outputs'
record of every assembled one whose assembler wrote none (producer/output_records.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from producer.commands.arguments import seconds
from producer.commands.exits import EXIT_FAILED, EXIT_NOT_DONE, EXIT_NOT_FOUND
from producer.commands.out_file import (
    audio_format_of,
    check_out_folder,
    check_stored,
    copy_replacing,
    write_replacing,
)
from producer.documents import DocumentStatus
from producer.output_records import backfill_output_records
from producer.segment_records import backfill_segment_records
from shared.document_state import DocumentFailedError, DocumentNotFoundError, DocumentResult
from shared.errors import InvalidRequestError, ResultTimeoutError
from shared.plurals import counted
from shared.results import AUDIO_FORMATS
from shared.storage import open_storage

if TYPE_CHECKING:
    from producer.cli import CliContext

OPTIONS = (
    "voice",
    "mode",
    "instruction",
    "language",
    "speed",
    "seed",
    "format",
    "sample_rate",
    "priority",
    "output_key",
    "idempotency_key",
)
# A file's markup by its name (--markup overrides): a .txt is plain text, its angle brackets
# read as written ("List<String>"); any other name is `auto` (SSML when it starts <speak>).
MARKUP_BY_SUFFIX = {
    ".md": "markdown",
    ".markdown": "markdown",
    ".ssml": "ssml",
    ".txt": "plain",
}


def register(subparsers: Any) -> None:
    document = subparsers.add_parser("document", help="long texts: one file with captions")
    commands = document.add_subparsers(dest="document_command", required=True, metavar="ACTION")
    submit = commands.add_parser("submit", help="split a text file into jobs and assemble it")
    submit.add_argument("file", type=Path, help="plain text (.txt), Markdown (.md) or SSML (.ssml)")
    submit.add_argument("--out", type=Path, help="the audio file to write (its format too)")
    submit.add_argument("--no-wait", action="store_true", help="print the id and return")
    submit.add_argument("--markup", choices=("auto", "plain", "markdown", "ssml"))
    submit.add_argument("--voice")
    submit.add_argument("--mode", choices=("zero_shot", "cross_lingual", "instruct2"))
    submit.add_argument("--instruction")
    submit.add_argument("--language", choices=("auto", "en", "zh", "ja", "ko", "yue"))
    submit.add_argument("--speed", type=float)
    submit.add_argument("--seed", type=int)
    submit.add_argument("--format", choices=AUDIO_FORMATS)
    submit.add_argument("--sample-rate", type=int)
    submit.add_argument("--priority", choices=("high", "default", "low"))
    submit.add_argument("--output-key")
    submit.add_argument("--idempotency-key")
    submit.add_argument("--timeout", type=seconds, default=24 * 3600.0, help="seconds to wait")
    submit.set_defaults(handler=run_submit)
    for name, handler, text in (
        ("status", run_status, "segments queued / running / done / failed, time left"),
        ("retry", run_retry, "rerun only the failed or lost segments"),
        ("cancel", run_cancel, "cancel the segments not done yet"),
        ("result", run_result, "a finished document; --out fetches its files"),
    ):
        command = commands.add_parser(name, help=text)
        command.add_argument("document_id")
        if name == "result":
            command.add_argument("--out", type=Path, help="write the audio, captions, manifest")
            command.add_argument("--wait", type=seconds, default=0.0, help="seconds to wait")
        if name == "cancel":
            command.add_argument(
                "--idempotency-key",
                metavar="KEY",
                help="a retry with the same key says what the first try did (the segments it "
                "canceled, not none, when its answer was lost)",
            )
        command.set_defaults(handler=handler)
    backfill = commands.add_parser(
        "backfill-records",
        help="write the segments' record of each live document submitted before records "
        "existed, so its segment audio is deleted once its plan expires, and the outputs' "
        "record of each assembled one lacking it, so its files follow COSYQ_AUDIO_RETENTION",
    )
    backfill.set_defaults(handler=run_backfill)


def run_backfill(args: argparse.Namespace, context: CliContext) -> int:
    """Prints the id of each document given a record, then how many on stderr."""
    with context.make_client(context.settings) as client:
        written = backfill_segment_records(client.connection, context.settings.result_ttl_s)
        outputs = backfill_output_records(client.connection, context.settings)
    for document_id in [*written, *(d for d in outputs if d not in written)]:
        context.out.print(document_id, markup=False)
    context.err.print(
        f"wrote the segments' record of {counted(len(written), 'document')}, the outputs' "
        f"record of {counted(len(outputs), 'assembled document')}",
        markup=False,
    )
    return 0


def document_request(args: argparse.Namespace) -> dict[str, Any]:
    """The document payload from the file and the options given (the format follows --out's
    suffix; a suffix that is no audio format, or not --format's, is a usage error)."""
    fmt = audio_format_of(args.out, args.format)
    check_out_folder(args.out)
    request: dict[str, Any] = {"text": read_document_text(args.file)}
    request["markup"] = args.markup or MARKUP_BY_SUFFIX.get(args.file.suffix.lower(), "auto")
    options = OPTIONS
    request.update({k: getattr(args, k) for k in options if getattr(args, k) is not None})
    if fmt is not None:
        request["format"] = fmt
    return request


# The encodings texts are most often saved in besides UTF-8 (a Chinese Windows saves GB18030/GBK:
# converted "from latin1", as the hint once said, it became mojibake that was then spoken).
ICONV_HINT = (
    "e.g. iconv -f gb18030 -t utf-8 for Chinese, -f big5 for traditional Chinese, -f shift_jis "
    "for Japanese, -f cp949 for Korean, -f cp1252 for Western European text"
)


def read_document_text(path: Path) -> str:
    """The document file as text: UTF-8 (a BOM is dropped), else one clear error."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise InvalidRequestError(f"{path}: cannot read ({e.strerror or e})") from e
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        raise InvalidRequestError(
            f"{path}: not UTF-8 text (byte 0x{raw[e.start]:02x} at byte {e.start + 1}); "
            f"save it as UTF-8 ({ICONV_HINT})"
        ) from None


def run_submit(args: argparse.Namespace, context: CliContext) -> int:
    with context.make_client(context.settings) as client:
        document_id = client.submit_document(document_request(args))
        if args.no_wait or args.out is None:
            context.out.print(document_id, markup=False)
            return 0
        context.err.print(f"document {document_id}", markup=False)
        try:
            result = _wait_with_progress(client, document_id, args.timeout, context)
        except DocumentFailedError as e:
            context.err.print(f"cosyq: {e}", markup=False)
            return EXIT_FAILED
    written = fetch_files(context, result, args.out)
    context.out.print(" ".join(str(p) for p in written), markup=False)
    return 0


def _wait_with_progress(client: Any, document_id: str, timeout: float, context: CliContext) -> Any:
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} segments"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=context.err, transient=True) as progress:
        task = progress.add_task("0 s of audio", total=None)

        def show(status: DocumentStatus) -> None:
            progress.update(
                task,
                total=status.segments,
                completed=status.done,
                description=f"{status.audio_s:,.0f} s of audio",
            )

        return client.document_result(document_id, timeout=timeout, on_progress=show)


def fetch_files(context: CliContext, result: DocumentResult, out: Path) -> list[Path]:
    """The audio at `out`, and the .srt, .vtt and .json (manifest) beside it."""
    storage = open_storage(context.settings)
    targets = [
        (result.uri, out),
        (result.srt_uri, out.with_suffix(".srt")),
        (result.vtt_uri, out.with_suffix(".vtt")),
        (result.manifest_uri, out.with_suffix(".json")),
    ]
    made = Path(urlsplit(result.uri).path).suffix.lstrip(".").lower() or None
    audio_format_of(out, made, named="the document's format")  # no WAV bytes in x.mp3
    for uri, _ in targets:  # all four checked before any is written
        check_stored(storage, uri)
    for uri, target in targets:
        parts = urlsplit(uri)
        if parts.scheme == "file":  # copied in blocks: an hour of audio is never read whole
            copy_replacing(Path(unquote(parts.path)), target)
        else:
            write_replacing(target, storage.get(uri))
    return [target for _, target in targets]


def run_status(args: argparse.Namespace, context: CliContext) -> int:
    with context.make_client(context.settings) as client:
        try:
            status = client.document_status(args.document_id)
        except DocumentNotFoundError as e:
            context.err.print(f"cosyq: {e}", markup=False)
            return EXIT_NOT_FOUND
    context.out.print_json(json.dumps(status.as_json(), ensure_ascii=False))
    if status.message:
        context.err.print(status.message, markup=False)
    return EXIT_FAILED if status.state in ("failed", "incomplete", "canceled") else 0


def run_retry(args: argparse.Namespace, context: CliContext) -> int:
    with context.make_client(context.settings) as client:
        try:
            redone = client.retry_document(args.document_id)
        except DocumentNotFoundError as e:
            context.err.print(f"cosyq: {e}", markup=False)
            return EXIT_NOT_FOUND
    shown = ", ".join(str(i) for i in redone) or "none (the assembly is checked)"
    context.out.print(f"segments re-enqueued: {shown}", markup=False)
    return 0


def run_cancel(args: argparse.Namespace, context: CliContext) -> int:
    """0 when something was canceled or stops, else 0 too with "nothing to cancel" (every
    segment already ended); 4 for no such document. A retry with the first try's
    --idempotency-key names the segments the first try canceled."""
    with context.make_client(context.settings) as client:
        try:
            outcomes = client.cancel_document(
                args.document_id, idempotency_key=args.idempotency_key
            )
        except DocumentNotFoundError as e:
            context.err.print(f"cosyq: {e}", markup=False)
            return EXIT_NOT_FOUND
    changed = sorted(i for i, outcome in outcomes.items() if outcome.changed)
    shown = ", ".join(str(i) for i in changed) or "none (every segment had ended)"
    context.out.print(f"segments canceled: {shown}", markup=False)
    return 0


def run_result(args: argparse.Namespace, context: CliContext) -> int:
    audio_format_of(args.out, None)  # an --out that cannot take audio: before any wait
    check_out_folder(args.out)
    with context.make_client(context.settings) as client:
        try:
            if args.wait > 0:
                result = client.document_result(args.document_id, timeout=args.wait)
            else:
                status = client.document_status(args.document_id)
                if status.result is None:
                    context.err.print(status.message or f"document: {status.state}", markup=False)
                    failed = status.state in ("failed", "incomplete")
                    return EXIT_FAILED if failed else EXIT_NOT_DONE
                result = status.result
        except DocumentNotFoundError as e:
            context.err.print(f"cosyq: {e}", markup=False)
            return EXIT_NOT_FOUND
        except DocumentFailedError as e:
            context.err.print(f"cosyq: {e}", markup=False)
            return EXIT_FAILED
        except ResultTimeoutError as e:
            context.err.print(f"cosyq: {e}", markup=False)
            return EXIT_NOT_DONE
    if args.out is not None:
        written = fetch_files(context, result, args.out)
        context.out.print(" ".join(str(p) for p in written), markup=False)
    else:
        context.out.print_json(result.model_dump_json())
    return 0
