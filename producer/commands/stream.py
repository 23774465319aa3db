"""`cosyq stream JOB_ID --out FILE|-`, and the writer `cosyq say --stream` shares: a WAV header
as soon as the first chunk arrives, then the PCM of each chunk as it comes
(`cosyq say --stream "hi" --out - | aplay` plays while the audio is made).

On stdout the header's sizes are the "unknown length" maximum that players accept for a live
stream; in a file they are patched to the real sizes once the final chunk arrived. A file is
written beside its target and moved into place only once the final chunk arrived
(producer/commands/out_file.py): a job that fails, times out or does not exist leaves an
existing file untouched.
"""

from __future__ import annotations

import argparse
import struct
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from producer.commands.arguments import seconds
from producer.commands.exits import UsageError
from producer.commands.out_file import replacing
from shared.audio_stream import AudioChunk
from shared.keys import check_job_id
from shared.plurals import counted

if TYPE_CHECKING:
    from producer.cli import CliContext

UNKNOWN_SIZE = 0xFFFFFFFF  # RIFF/data size of a stream whose length is not known yet
HEADER_BYTES = 44


def register(subparsers: Any) -> None:
    stream = subparsers.add_parser(
        "stream", help="write a streamed job's audio (WAV) as it arrives"
    )
    stream.add_argument("job_id")
    stream.add_argument("--out", required=True, help="a .wav file, or - for stdout")
    stream.add_argument("--timeout", type=seconds, help="seconds to wait (COSYQ_STREAM_TIMEOUT_S)")
    stream.set_defaults(handler=run_stream)


def wav_header(sample_rate: int, data_bytes: int | None) -> bytes:
    """A 44-byte PCM16 mono WAV header; `data_bytes` None: a stream of unknown length."""
    data = UNKNOWN_SIZE - 36 if data_bytes is None else data_bytes
    riff = UNKNOWN_SIZE if data_bytes is None else 36 + data_bytes
    return b"".join(
        (
            b"RIFF",
            struct.pack("<I", riff),
            b"WAVEfmt ",
            struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16),
            b"data",
            struct.pack("<I", data),
        )
    )


def write_wav_stream(chunks: Iterable[AudioChunk], out: IO[bytes], *, seekable: bool) -> int:
    """Header then PCM, flushed per chunk; returns the PCM bytes written. A seekable file gets
    its real sizes at the end."""
    written = 0
    rate: int | None = None
    for chunk in chunks:
        if rate is None:
            rate = chunk.sample_rate
            out.write(wav_header(rate, None))
        out.write(chunk.pcm)
        out.flush()
        written += len(chunk.pcm)
    if rate is not None and seekable:
        out.seek(0)
        out.write(wav_header(rate, written))
        out.flush()
    return written


def stream_to(
    context: CliContext, client: Any, job_id: str, out: str, timeout: float | None
) -> int:
    """Write the job's stream to `out` (a path or "-"); prints a summary line on stderr."""
    wait = timeout if timeout is not None else context.settings.stream_timeout_s
    chunks = client.stream(job_id, timeout=wait)
    seen: list[AudioChunk] = []

    def tracked() -> Iterable[AudioChunk]:
        for chunk in chunks:
            seen.append(chunk)
            yield chunk

    if out == "-":
        written = write_wav_stream(tracked(), sys.stdout.buffer, seekable=False)
    else:
        with replacing(Path(out)) as f:
            written = write_wav_stream(tracked(), f, seekable=True)
    rate = seen[0].sample_rate if seen else 0
    seconds = written / 2 / rate if rate else 0.0
    uri = seen[-1].uri if seen else None
    where = "stdout" if out == "-" else out
    context.err.print(
        f"streamed {counted(len(seen), 'chunk')}, {seconds:.2f} s at {rate} Hz to {where} "
        f"(job {job_id}; stored at {uri})",
        markup=False,
    )
    return 0


def check_stream_out(out: str | None) -> None:
    """--out of a stream: a .wav file (or no suffix) or - for stdout; UsageError otherwise."""
    if out is None:
        raise UsageError("--stream: give --out FILE.wav or --out - (stdout)")
    if out != "-" and Path(out).suffix.lower() not in ("", ".wav"):
        raise UsageError("--out: a stream is written as WAV (.wav or -)")


def run_stream(args: argparse.Namespace, context: CliContext) -> int:
    check_stream_out(args.out)
    check_job_id(args.job_id)
    with context.make_client(context.settings) as client:
        return stream_to(context, client, args.job_id, args.out, args.timeout)
