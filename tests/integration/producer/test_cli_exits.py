"""More of the `cosyq` command line as a careless or hostile user drives it (issue 45 items 11
and 12): files that are not text, --out paths that cannot be written or do not name audio, a
stdout whose reader is gone before anything is written, a canceled job in `submit --wait`, a
transcript of bytes that are not UTF-8, a busy port. Each ends with one line on stderr and the
status of README's exit table, never a traceback.

Fixtures and helpers are test_cli_hostile.py's (a real redis-server, no worker).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import redis
import soundfile

from producer import CosyqClient
from shared import keys
from shared.settings import Settings
from tests.integration.producer import test_cli_hostile as hostile

COSYQ, cosyq, one_line = hostile.COSYQ, hostile.cosyq, hostile.one_line
settings, connection = hostile.settings, hostile.connection  # the same fixtures

WORKER_CLI = Path(sys.executable).parent / "cosyq-worker"


def run(*argv: str | bytes, closed_stdout: bool = False) -> subprocess.CompletedProcess[str]:
    """A console script as a user runs it; `closed_stdout`: its reader is gone before it starts,
    so its first write to stdout fails (what `| head -c1` does sooner or later)."""
    read_end, write_end = os.pipe()
    if closed_stdout:
        os.close(read_end)
    try:
        return subprocess.run(
            argv,
            stdout=write_end if closed_stdout else subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            timeout=180,
            check=False,
        )
    finally:
        os.close(write_end)
        if not closed_stdout:
            os.close(read_end)


def queued(connection: redis.Redis) -> int:
    return sum(int(connection.llen(f"rq:queue:{name}")) for name in keys.QUEUES_IN_PRIORITY_ORDER)


def wav_file(path: Path) -> Path:
    t = np.arange(24000) / 24000
    soundfile.write(path, 0.3 * np.sin(2 * np.pi * 220 * t), 24000)
    return path


# ---- files that are not text, --out that cannot be written


@pytest.mark.parametrize(
    "content",
    [
        "Grüße aus Köln.".encode("latin-1"),
        "第三章　雨夜归人".encode("gb18030"),  # a Chinese Windows's Notepad
        b"\x89PNG\r\n\x1a\n\x00\x00\xff\xd8",
    ],
)
def test_document_submit_of_a_file_that_is_not_utf8_is_one_line(
    settings: Settings, connection: redis.Redis, tmp_path: Path, content: bytes, capsys
) -> None:
    source = tmp_path / "book.txt"
    source.write_bytes(content)
    before = connection.dbsize()
    assert cosyq("document", "submit", str(source)) == 1
    error = one_line(capsys.readouterr().err)
    assert "book.txt: not UTF-8 text (byte 0x" in error
    assert "iconv -f gb18030 -t utf-8 for Chinese" in error  # never "from latin1" alone
    assert connection.dbsize() == before  # nothing submitted


@pytest.mark.parametrize("verb", ["submit", "result"])
def test_document_out_with_a_suffix_that_is_no_audio_is_2(
    settings: Settings, connection: redis.Redis, tmp_path: Path, verb: str, capsys
) -> None:
    source = tmp_path / "book.txt"
    source.write_text("One sentence.")
    target = str(tmp_path / "x.exe")
    argv = ("submit", str(source)) if verb == "submit" else ("result", "doc1")
    before = connection.dbsize()
    assert cosyq("document", *argv, "--out", target) == 2
    assert "--out: .exe is not one of wav" in one_line(capsys.readouterr().err)
    assert connection.dbsize() == before and not (tmp_path / "x.exe").exists()


@pytest.mark.parametrize(
    "argv",
    [
        ("stream", "job1"),
        ("say", "Hello."),
        ("say", "Hello.", "--stream"),
        ("document", "result", "doc1"),
        ("document", "submit", "book.txt"),
    ],
)
def test_out_where_nothing_can_be_written_is_2_before_anything_is_submitted(
    settings: Settings, connection: redis.Redis, tmp_path: Path, argv: tuple[str, ...], capsys
) -> None:
    (tmp_path / "book.txt").write_text("One sentence.")
    before = connection.dbsize()
    assert cosyq(*argv, "--out", "/proc/nonexist/x.wav") == 2
    assert "--out /proc/nonexist/x.wav: cannot write there" in one_line(capsys.readouterr().err)
    assert connection.dbsize() == before


def test_an_env_file_that_is_not_text_is_2(settings: Settings, tmp_path: Path) -> None:
    binary = tmp_path / "binary.env"
    binary.write_bytes(b"\xff\xfe\x00\x01COSYQ_X=\x9c\x00\n")
    done = run(str(COSYQ), "--env-file", str(binary), "status")
    assert done.returncode == 2
    assert "is not UTF-8 text" in one_line(done.stderr)


@pytest.mark.parametrize("where", ["/proc/x/y", "a-file"])
def test_init_tiny_where_no_folder_can_be_made_is_2(tmp_path: Path, where: str) -> None:
    target = tmp_path / where if where == "a-file" else Path(where)
    if where == "a-file":
        target.write_bytes(b"mine")
    done = run(str(WORKER_CLI), "model", "init-tiny", str(target))
    assert done.returncode == 2, done.stderr
    assert str(target) in one_line(done.stderr)
    if where == "a-file":
        assert target.read_bytes() == b"mine"


# ---- stdout closed by its reader: the command runs to its end, then 141


def test_status_into_a_closed_stdout_exits_141(settings: Settings) -> None:
    done = run(str(COSYQ), "status", closed_stdout=True)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr


def test_submit_into_a_closed_stdout_submits_every_line_then_141(
    settings: Settings, connection: redis.Redis, tmp_path: Path
) -> None:
    lines = 3 * settings.submit_chunk_size + 1  # several chunks, each printed as it goes in
    many = tmp_path / "many.jsonl"
    many.write_text("".join(json.dumps({"text": f"Line {i}."}) + "\n" for i in range(lines)))
    done = run(str(COSYQ), "submit", str(many), closed_stdout=True)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr
    assert queued(connection) == lines  # not one chunk, then a "failed" that invites a resubmit


# ---- a canceled job in submit --wait is canceled, not failed


def test_submit_wait_counts_a_canceled_job_as_canceled(
    settings: Settings, connection: redis.Redis, tmp_path: Path, capsys
) -> None:
    (tmp_path / "one.jsonl").write_text(json.dumps({"text": "Canceled soon."}) + "\n")
    results = tmp_path / "r.jsonl"

    def cancel_it() -> None:
        job_id = None
        while job_id is None:
            ids = connection.lrange(f"rq:queue:{keys.QUEUE_DEFAULT}", 0, 0)
            job_id = ids[0].decode() if ids else None
        with CosyqClient(settings) as client:
            client.cancel(job_id)

    canceler = threading.Thread(target=cancel_it, daemon=True)
    canceler.start()
    argv = ("submit", "one.jsonl", "--wait", "--timeout", "60", "--results", str(results))
    status = cosyq(*argv)
    canceler.join(timeout=30)
    captured = capsys.readouterr()
    assert status == 6, captured.err
    table = captured.out.splitlines()
    header = next(line for line in table if "canceled" in line)
    row = table[table.index(header) + 2]
    columns = [c.strip() for c in header.split("┃")][1:-1]
    cells = dict(zip(columns, (c.strip() for c in row.split("│")[1:-1]), strict=True))
    assert (cells["ok"], cells["failed"], cells["canceled"]) == ("0", "0", "1")
    assert "failed:" not in captured.err
    [record] = map(json.loads, results.read_text().splitlines())
    assert record["status"] == "canceled"


# ---- a transcript of bytes that are not UTF-8


def test_voices_add_with_a_transcript_of_undecodable_bytes_stores_nothing(
    settings: Settings, connection: redis.Redis, tmp_path: Path
) -> None:
    recording = wav_file(tmp_path / "alice.wav")
    done = run(str(COSYQ), "voices", "add", "alice", str(recording), "--text", b"\xff\xfe")
    assert done.returncode == 1
    assert "transcript: not valid UTF-8" in one_line(done.stderr)
    assert not (tmp_path / "audio").exists() or list((tmp_path / "audio").rglob("*.*")) == []
    assert queued(connection) == 0


# ---- cosyq serve on a busy port


def test_serve_on_a_busy_port_is_2_in_one_line(settings: Settings) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run(str(COSYQ), "serve", "--port", str(port))
    assert done.returncode == 2, done.stderr
    assert f"--port {port}: cannot listen there" in one_line(done.stderr)
