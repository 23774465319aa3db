"""`cosyq submit FILE.jsonl` and `cosyq say "text"`: put work on the queue, optionally wait."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from producer.commands.arguments import seconds
from producer.commands.batch_report import ResultsFile, print_summary
from producer.commands.exits import EXIT_CANCELED, EXIT_FAILED, EXIT_NOT_DONE, UsageError
from producer.commands.out_file import (
    audio_format_of,
    check_out_folder,
    check_own_audio,
    check_stored,
    write_replacing,
)
from producer.commands.stream import check_stream_out, stream_to
from producer.tracking import JobOutcome
from shared.errors import InvalidRequestError, QueueFullError, SubmitInterruptedError
from shared.jobs import DEFAULT_VOICE, RequestLimits, SynthesisRequest, validate_request
from shared.plurals import counted
from shared.results import AUDIO_FORMATS
from shared.storage import open_storage
from shared.voices import missing_voices, unknown_voice

if TYPE_CHECKING:
    from producer.cli import CliContext


@dataclass(frozen=True)
class Line:
    number: int  # 1-based line number in the file
    request: SynthesisRequest


def register(subparsers: Any) -> None:
    submit = subparsers.add_parser(
        "submit",
        help="submit one request per line of a JSONL file",
        description="Submit one SynthesisRequest (a JSON object, UTF-8) per line. Bad lines "
        "(not UTF-8, not JSON, not a valid request) are reported with their number and "
        "skipped; the rest are submitted, and the exit status is 1. Prints one job id per "
        "submitted line as it goes in. With --wait, exit status 3 means every job that "
        "finished succeeded but some were still queued or running at --timeout.",
        epilog='example line: {"text": "Hello.", "voice": "default", "format": "flac"}',
    )
    submit.add_argument(
        "file", help="JSONL file, one SynthesisRequest object per line ('-': stdin)"
    )
    submit.add_argument("--wait", action="store_true", help="wait for every job, then summarize")
    submit.add_argument("--results", type=Path, help="with --wait: write one JSON line per job")
    submit.add_argument(
        "--timeout", type=seconds, help="with --wait: seconds (COSYQ_WAIT_TIMEOUT_S)"
    )
    submit.add_argument("--block", action="store_true", help="wait for room when a queue is full")
    submit.set_defaults(handler=run_submit)

    say = subparsers.add_parser("say", help="synthesize one text and fetch the audio")
    say.add_argument("text")
    say.add_argument("--voice", help="a registered voice (default: the model's 'default')")
    say.add_argument(
        "--markup",
        choices=("auto", "plain"),
        default="auto",
        help="plain: read every angle bracket as written ('List<String>'); auto: SSML and tags",
    )
    say.add_argument(
        "--out", help="write the audio here (format from the suffix); with --stream: .wav or -"
    )
    say.add_argument(
        "--stream", action="store_true", help="write WAV as the chunks arrive (needs --out)"
    )
    say.add_argument(
        "--format", choices=AUDIO_FORMATS, help="wav, flac, ogg, mp3 or opus (default wav)"
    )
    say.add_argument("--mode", default="zero_shot", help="zero_shot, cross_lingual, instruct2")
    say.add_argument("--instruction", help="instruct2: how to speak")
    say.add_argument("--speed", type=float, default=1.0)
    say.add_argument("--seed", type=int)
    say.add_argument("--sample-rate", type=int, default=24000)
    say.add_argument("--priority", default="high", help="high, default or low (default high)")
    say.add_argument("--timeout", type=seconds, help="seconds to wait (COSYQ_WAIT_TIMEOUT_S)")
    say.set_defaults(handler=run_say)


def read_requests(
    lines: Iterable[bytes | str], limits: RequestLimits
) -> tuple[list[Line], list[str]]:
    """Valid requests with their line numbers, and one problem per bad line ("line 7: ...").

    Lines are read as UTF-8 one by one, so a Latin-1 or binary line is reported by number and
    the lines after it still count; a UTF-8 byte order mark before line 1 is dropped. Blank
    lines are skipped silently.
    """
    good: list[Line] = []
    problems: list[str] = []
    for number, raw in enumerate(lines, start=1):
        try:
            text = _decoded(raw, first=number == 1)
            if not text.strip():
                continue
            data = json.loads(text)
        except UnicodeDecodeError as e:
            byte = e.object[e.start]
            problems.append(f"line {number}: not UTF-8 (byte 0x{byte:02x} at byte {e.start + 1})")
            continue
        except json.JSONDecodeError as e:
            problems.append(f"line {number}: not JSON ({e.msg} at column {e.colno})")
            continue
        try:
            good.append(Line(number, validate_request(data, limits)))
        except InvalidRequestError as e:
            problems.append(f"line {number}: {e}")
    return good, problems


def _decoded(raw: bytes | str, *, first: bool) -> str:
    text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    return text.removeprefix("\ufeff") if first else text


def _open_input(name: str) -> BinaryIO:
    """The JSONL file (or stdin) as bytes: each line is decoded on its own."""
    if name == "-":
        return sys.stdin.buffer
    try:
        return Path(name).open("rb")
    except OSError as e:
        raise InvalidRequestError(f"{name}: cannot read ({e.strerror})") from e


def run_submit(args: argparse.Namespace, context: CliContext) -> int:
    if args.results is not None and not args.wait:
        context.err.print("cosyq submit: --results needs --wait")
        return 2
    settings = context.settings
    if args.block:
        settings = settings.model_copy(update={"backpressure": "block"})
    source = _open_input(args.file)
    with source:
        lines, problems = read_requests(source, RequestLimits.from_settings(settings))
    started = time.monotonic()
    with context.make_client(settings) as client:
        lines, problems = _known_voices(client, lines, problems)
        for problem in problems:
            context.err.print(problem, markup=False)
        job_ids, submitted = _submit_lines(client, lines, context)
        skipped = counted(len(problems), "bad line")
        context.err.print(
            f"submitted {counted(len(job_ids), 'job')}; {skipped} skipped", markup=False
        )
        if not args.wait:
            return 1 if problems or len(submitted) < len(lines) else 0
        timeout = args.timeout if args.timeout is not None else settings.wait_timeout_s
        numbers = [line.number for line in submitted]
        with contextlib.ExitStack() as stack:
            results = None
            if args.results is not None:
                results = stack.enter_context(ResultsFile(args.results, numbers, job_ids))
            outcomes = _wait_with_progress(client, job_ids, timeout, context, results)
            if results is not None:
                results.write_rest(outcomes)
    wall_s = time.monotonic() - started
    tally = print_summary(context, numbers, job_ids, outcomes, wall_s)
    if problems or tally.failed or len(submitted) < len(lines):
        return EXIT_FAILED
    if tally.canceled:
        return EXIT_CANCELED
    return EXIT_NOT_DONE if tally.pending else 0


def _known_voices(
    client: Any, lines: list[Line], problems: list[str]
) -> tuple[list[Line], list[str]]:
    """Lines naming a voice the client's tenant cannot use join the bad lines (looked up in one
    round trip), so the rest go in: submit_many would refuse them all for one such line."""
    names = {line.request.voice for line in lines} - {None, DEFAULT_VOICE}
    missing = missing_voices(client.connection, client.tenant, [name for name in names if name])
    unknown = [line for line in lines if line.request.voice in missing]
    problems = problems + [
        f"line {line.number}: {unknown_voice(client.tenant, str(line.request.voice))}"
        for line in unknown
    ]
    return [line for line in lines if line not in unknown], problems


def _submit_lines(
    client: Any, lines: list[Line], context: CliContext
) -> tuple[list[str], list[Line]]:
    """Submit, printing each job id as its chunk goes in; when a queue fills up or Redis
    refuses a chunk, keep what went in and report the rest as not submitted."""

    def printed(chunk: list[tuple[int, str]]) -> None:
        for _, job_id in chunk:
            context.out.print(job_id, markup=False)
        context.out.flush_output()  # a closed stdout: quiet, every line still submitted

    try:
        return client.submit_many([line.request for line in lines], on_submitted=printed), lines
    except (QueueFullError, SubmitInterruptedError) as e:
        submitted = list(e.submitted)
        skipped = lines[len(submitted) :]
        context.err.print(f"cosyq: {e}", markup=False)
        if skipped:
            hint = "use --block to wait for room" if isinstance(e, QueueFullError) else "rerun"
            context.err.print(
                f"not submitted: lines {skipped[0].number}-{skipped[-1].number} "
                f"({hint} with only those lines; the ids above are in the queue)",
                markup=False,
            )
        return submitted, lines[: len(submitted)]


def _wait_with_progress(
    client: Any,
    job_ids: Sequence[str],
    timeout: float,
    context: CliContext,
    results: ResultsFile | None,
) -> dict[str, JobOutcome]:
    columns = (BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress("waiting", *columns, console=context.err, transient=False) as progress:
        task = progress.add_task("jobs", total=len(set(job_ids)))

        def on_progress(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        def on_outage(message: str) -> None:
            progress.console.print(f"cosyq: {message}", markup=False)

        outcome: dict[str, JobOutcome] = client.wait_many(
            job_ids,
            timeout,
            on_progress,
            on_outcome=results.write if results is not None else None,
            on_outage=on_outage,
        )
        return outcome


def say_request(args: argparse.Namespace) -> dict[str, Any]:
    """The request `cosyq say` submits; the format follows --out's suffix when it has one."""
    fmt = args.format
    out = None if args.out in (None, "-") else Path(args.out)
    if getattr(args, "stream", False):
        check_stream_out(args.out)
    elif args.out == "-":
        raise UsageError("--out -: stdout takes only a stream (add --stream)")
    fmt = audio_format_of(out, fmt)
    check_out_folder(out)
    request: dict[str, Any] = {
        "text": args.text,
        "markup": args.markup,
        "mode": args.mode,
        "speed": args.speed,
        "format": fmt or "wav",
        "sample_rate": args.sample_rate,
        "priority": args.priority,
    }
    for field in ("voice", "instruction", "seed"):
        if getattr(args, field) is not None:
            request[field] = getattr(args, field)
    if getattr(args, "stream", False):
        request["stream"] = True
    return request


def run_say(args: argparse.Namespace, context: CliContext) -> int:
    request = say_request(args)
    timeout = args.timeout if args.timeout is not None else context.settings.wait_timeout_s
    with context.make_client(context.settings) as client:
        job_id = client.submit(request)
        if request.get("stream"):
            return stream_to(context, client, job_id, args.out, args.timeout)
        with context.err.status(f"synthesizing (job {job_id})"):
            result = client.result(job_id, timeout=timeout)
    line = f"{result.duration_s:.2f} s of audio at {result.sample_rate} Hz, RTF {result.rtf:.3f}"
    if args.out is None:
        context.out.print(f"{result.uri}  ({line}, job {job_id})", markup=False)
        return 0
    storage = open_storage(context.settings)
    check_stored(storage, result.uri)
    data = storage.get(result.uri)
    check_own_audio(data, result)
    write_replacing(Path(args.out), data)
    context.out.print(f"wrote {args.out}: {line} (job {job_id})", markup=False)
    return 0
