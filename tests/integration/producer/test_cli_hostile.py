"""The `cosyq` command line as a careless or hostile user drives it, against a real redis-server:
malformed job ids, undecodable input lines, a closed stdout, jobs that fail or never run while
the user's --out file already exists, Redis down. Every case ends with one clear line on stderr
and the status from the exit table (producer/commands/exits.py), never a traceback.

There is no worker here: where a stream must arrive, the test writes the entries a streaming
worker would (shared/audio_stream.py's format) and sets the job's state as the worker would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import soundfile
from rq.job import Job
from rq.results import Result
from rq.serializers import JSONSerializer

from producer import CosyqClient
from producer.cli import main
from shared import audio_stream, keys
from shared.keys import audio_stream_key
from shared.results import JobFailure, ModelInfo, StageTimings, SynthesisResult
from shared.settings import Settings, load_settings
from shared.storage import FileStorage
from shared.voices import VoiceProfile, VoiceRegistry, VoiceSummary
from tests.conftest import free_port
from workers.documents.job import assemble
from workers.tools.bench.document import synthetic_document

COSYQ = Path(sys.executable).parent / "cosyq"
RATE = 24000
KEEP = b"RIFF precious bytes the user already had"


@pytest.fixture
def settings(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_STORAGE_URL", (tmp_path / "audio").as_uri())
    monkeypatch.setenv("COSYQ_MAX_RETRIES", "0")
    monkeypatch.chdir(tmp_path)  # no stray .env
    return load_settings(env_file=None)


@pytest.fixture
def connection(settings: Settings) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(settings.redis_url)
    yield client
    client.close()


def cosyq(*argv: str) -> int:
    return main(list(argv))


def one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def pcm(n: int, seq: int) -> bytes:
    return (np.arange(n, dtype=np.int16) * (seq + 1)).astype("<i2").tobytes()


def next_job(connection: redis.Redis, timeout: float = 30.0) -> str:
    """The id of the first job to appear in the high queue (what `cosyq say` submits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ids = connection.lrange(f"rq:queue:{keys.QUEUE_HIGH}", 0, 0)
        if ids:
            return str(ids[0].decode())
        time.sleep(0.02)
    raise AssertionError("no job was submitted")


def stream_audio(connection: redis.Redis, job_id: str, pieces: list[bytes]) -> None:
    """What a streaming worker writes: chunks, a final entry, then the job is finished."""
    key = audio_stream_key(job_id)
    for seq, data in enumerate(pieces):
        connection.xadd(key, audio_stream.chunk_fields(seq, 1, RATE, data))  # type: ignore[arg-type]
    final = audio_stream.final_fields(len(pieces), 1, RATE, b"", uri="file:///x.wav", samples=0)
    connection.xadd(key, final)  # type: ignore[arg-type]
    connection.hset(f"rq:job:{job_id}", "status", "finished")


def stream_failure(connection: redis.Redis, job_id: str, *, after: list[bytes]) -> None:
    """A streamed job that fails for good (after `after` chunks): error entry, failed state."""
    key = audio_stream_key(job_id)
    for seq, data in enumerate(after):
        connection.xadd(key, audio_stream.chunk_fields(seq, 1, RATE, data))  # type: ignore[arg-type]
    failed = audio_stream.error_fields(len(after), 1, RATE, kind="internal", message="vocoder died")
    connection.xadd(key, failed)  # type: ignore[arg-type]
    job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
    job.meta[keys.ERROR_META_KEY] = JobFailure("internal", "vocoder died").as_meta()
    job.save_meta()
    connection.hset(f"rq:job:{job_id}", "status", "failed")


def as_worker(connection: redis.Redis, act: Callable[[redis.Redis, str], None]) -> threading.Thread:
    """Play the worker on its own thread: wait for the submitted job, then `act` on it."""
    thread = threading.Thread(target=lambda: act(connection, next_job(connection)), daemon=True)
    thread.start()
    return thread


def folder_holds_only(path: Path) -> list[str]:
    """Every name in the --out file's folder (no temporary file may be left behind)."""
    return sorted(p.name for p in path.parent.iterdir())


# ---- malformed job ids


@pytest.mark.parametrize(
    "argv",
    [
        ("result", "../../etc/passwd"),
        ("result", "--wait", "1", "a/b"),
        ("stream", "a/b", "--out", "x.wav"),
        ("failed", "--requeue", "a/b"),
        ("result", ""),
    ],
)
def test_a_malformed_job_id_is_a_usage_error_in_one_line(
    settings: Settings, argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cosyq(*argv) == 2
    line = one_line(capsys.readouterr().err)
    assert line.startswith("cosyq: job id ") and "a job id is 1-64 letters, digits" in line


def test_the_console_script_exits_2_for_a_path_as_job_id(settings: Settings) -> None:
    done = subprocess.run(
        [str(COSYQ), "result", "../../etc/passwd"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and one_line(done.stderr).startswith("cosyq: job id ")


# ---- undecodable input lines


def test_submit_reports_undecodable_lines_by_number_and_submits_the_rest(
    settings: Settings, connection: redis.Redis, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch = tmp_path / "batch.jsonl"
    batch.write_bytes(
        b"\xef\xbb\xbf"  # a UTF-8 byte order mark before line 1
        + b'{"text": "First."}\n'
        + '{"text": "Caf\u00e9."}\n'.encode("latin-1")  # line 2: Latin-1
        + b"\x00\xff\xfe\x89PNG\r\n"  # line 3: binary
        + b'{"text": "Fourth."}\n'
    )
    assert cosyq("submit", str(batch)) == 1  # bad lines make the run unclean
    captured = capsys.readouterr()
    assert "line 2: not UTF-8 (byte 0xe9 at byte 14)" in captured.err
    assert "line 3: not UTF-8 (byte 0xff at byte 2)" in captured.err
    assert "line 1:" not in captured.err and "Traceback" not in captured.err
    assert "submitted 2 jobs; 2 bad lines skipped" in captured.err
    ids = captured.out.split()
    assert len(ids) == 2 and connection.llen(f"rq:queue:{keys.QUEUE_DEFAULT}") == 2
    texts = [CosyqClient(settings).tracker.fetch(i).kwargs["request"]["text"] for i in ids]
    assert texts == ["First.", "Fourth."]


def test_submit_from_stdin_with_a_bom_and_a_latin1_line(settings: Settings) -> None:
    data = b'\xef\xbb\xbf{"text": "One."}\n' + b'{"text": "\xe9t\xe9"}\n' + b'{"text": "Two."}\n'
    done = subprocess.run(
        [str(COSYQ), "submit", "-"], input=data, capture_output=True, timeout=60, check=False
    )
    err = done.stderr.decode()
    assert done.returncode == 1 and "Traceback" not in err
    assert "line 2: not UTF-8" in err and "submitted 2 jobs; 1 bad line skipped" in err
    assert len(done.stdout.split()) == 2


# ---- stdout closed by its reader


def test_a_stream_into_head_exits_quietly(settings: Settings, connection: redis.Redis) -> None:
    pieces = [pcm(4800, seq) for seq in range(40)]  # 384 KB: more than any pipe buffer
    worker = as_worker(connection, lambda c, job_id: stream_audio(c, job_id, pieces))
    pipeline = f"'{COSYQ}' say 'Hello there.' --stream --out - | head -c 100 | wc -c"
    done = subprocess.run(
        ["bash", "-c", f'set -o pipefail; {pipeline}; echo "status ${{PIPESTATUS[0]}}" >&2'],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    worker.join(timeout=30)
    assert done.stdout.split() == ["100"]
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "status 141"


# ---- the user's --out file is never emptied by a job that is not good


def test_stream_of_no_such_job_leaves_the_file_untouched(
    settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keep = tmp_path / "out" / "keep.wav"
    keep.parent.mkdir()
    keep.write_bytes(KEEP)
    assert cosyq("stream", "nosuchjob", "--out", str(keep)) == 4
    assert "no job nosuchjob" in one_line(capsys.readouterr().err)
    assert keep.read_bytes() == KEEP and folder_holds_only(keep) == ["keep.wav"]


def test_say_stream_whose_job_fails_leaves_the_file_untouched(
    settings: Settings, connection: redis.Redis, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keep = tmp_path / "keep.wav"
    keep.write_bytes(KEEP)
    worker = as_worker(connection, lambda c, job_id: stream_failure(c, job_id, after=[pcm(800, 0)]))
    assert cosyq("say", "Hello.", "--stream", "--out", str(keep), "--timeout", "30") == 1
    worker.join(timeout=30)
    assert "vocoder died" in capsys.readouterr().err
    assert keep.read_bytes() == KEEP
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".keep")) == []


@pytest.mark.parametrize("stream", [True, False])
def test_say_that_times_out_while_queued_exits_3_and_leaves_the_file(
    settings: Settings, tmp_path: Path, stream: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    keep = tmp_path / "keep.wav"
    keep.write_bytes(KEEP)
    argv = ["say", "Nobody runs this.", "--out", str(keep), "--timeout", "0.5"]
    assert cosyq(*argv, *(["--stream"] if stream else [])) == 3  # like `cosyq result`
    assert "Traceback" not in capsys.readouterr().err
    assert keep.read_bytes() == KEEP
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".keep")] == []


def test_say_stream_that_succeeds_replaces_the_file(
    settings: Settings, connection: redis.Redis, tmp_path: Path
) -> None:
    keep = tmp_path / "keep.wav"
    keep.write_bytes(KEEP)
    os.chmod(keep, 0o640)
    pieces = [pcm(2400, seq) for seq in range(3)]
    worker = as_worker(connection, lambda c, job_id: stream_audio(c, job_id, pieces))
    assert cosyq("say", "Hello.", "--stream", "--out", str(keep), "--timeout", "30") == 0
    worker.join(timeout=30)
    data = keep.read_bytes()
    assert data[:4] == b"RIFF" and data[44:] == b"".join(pieces)
    assert int.from_bytes(data[40:44], "little") == len(b"".join(pieces))  # real sizes
    assert keep.stat().st_mode & 0o777 == 0o640  # the user's permissions kept
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".keep")) == []


# ---- exit codes


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--stream", "--out", "foo.mp3"), "--out: a stream is written as WAV (.wav or -)"),
        (("--stream",), "--stream: give --out FILE.wav or --out - (stdout)"),
        (("--out", "foo.xyz"), "--out: .xyz is not one of wav, flac, ogg, mp3, opus"),
        (("--out", "-"), "--out -: stdout takes only a stream (add --stream)"),
        (("--out", "a.flac", "--format", "wav"), "--out: .flac does not match --format wav"),
    ],
)
def test_say_usage_errors_exit_2(
    settings: Settings,
    connection: redis.Redis,
    argv: tuple[str, ...],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cosyq("say", "Hello.", *argv) == 2
    assert one_line(capsys.readouterr().err) == f"cosyq: {message}"
    assert connection.llen(f"rq:queue:{keys.QUEUE_HIGH}") == 0  # nothing was submitted


def test_stream_usage_error_exits_2(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    assert cosyq("stream", "abc", "--out", "foo.mp3") == 2
    assert (
        one_line(capsys.readouterr().err) == "cosyq: --out: a stream is written as WAV (.wav or -)"
    )


def test_redis_down_is_its_own_exit_status(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COSYQ_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    monkeypatch.setenv("COSYQ_REDIS_CONNECT_TIMEOUT_S", "1")
    for argv in (("result", "abc"), ("result", "--wait", "0.5", "abc"), ("status",)):
        assert cosyq(*argv) == 5, argv  # not 1: nothing says the job failed
        err = capsys.readouterr().err
        assert "Traceback" not in err and "cosyq: Redis at redis://127.0.0.1:" in err


def test_a_single_submit_error_has_no_request_index(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cosyq("say", "x" * 2001) == 1
    assert one_line(capsys.readouterr().err) == "cosyq: text: 2,001 characters, limit 2,000"
    with CosyqClient(settings) as client:
        with pytest.raises(Exception, match=r"^text: 2,001 characters, limit 2,000$"):
            client.submit({"text": "x" * 2001})
        with pytest.raises(Exception, match=r"^requests\[1\]: text: 2,001 characters"):
            client.submit_many([{"text": "fine"}, {"text": "x" * 2001}])


def test_voices_rm_default_says_it_is_the_builtin(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cosyq("voices", "rm", "default") == 1
    line = one_line(capsys.readouterr().err)
    assert "'default' is the model's built-in voice" in line and "cannot be removed" in line


def test_result_of_a_queued_job_is_3_and_json_on_stdout(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    with CosyqClient(settings) as client:
        job_id = client.submit({"text": "pending"})
    assert cosyq("result", "--wait", "0.2", job_id) == 3
    assert json.loads(capsys.readouterr().out)["state"] == "queued"


def test_voices_rm_deletes_the_recording_wherever_add_stored_it(
    settings: Settings,
    connection: redis.Redis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The default storage folder follows the working directory: `rm` run from another one
    must still delete the recording `add` uploaded (its URI says where)."""
    monkeypatch.delenv("COSYQ_STORAGE_URL")
    adding, removing = tmp_path / "here", tmp_path / "there"
    adding.mkdir()
    removing.mkdir()
    recording = adding / "alice.wav"
    t = np.arange(24000) / 24000
    soundfile.write(recording, 0.3 * np.sin(2 * np.pi * 220 * t), 24000)
    monkeypatch.chdir(adding)
    assert cosyq("voices", "add", "alice", str(recording), "--text", "Hi.", "--no-wait") == 0
    job_id = capsys.readouterr().out.strip()
    uri = Job.fetch(job_id, connection=connection, serializer=JSONSerializer).kwargs["prompt_audio"]
    [upload] = list((adding / "cosyq-output" / "voices" / "default" / "alice").iterdir())
    assert uri == upload.as_uri() and upload.suffix == ".wav"
    register_voice(connection, "alice", uri)  # what the add-voice job's worker does
    monkeypatch.chdir(removing)
    assert cosyq("voices", "rm", "alice") == 0
    assert not upload.exists()
    assert cosyq("voices", "rm", "alice") == 1
    assert "no voice named 'alice' is registered" in one_line(capsys.readouterr().err)


def register_voice(connection: redis.Redis, name: str, source_uri: str) -> None:
    summary = VoiceSummary(
        name=name,
        transcript="Hi.",
        speech_tokens=3,
        source_sample_rate=24000,
        source_seconds=1.0,
        model_name="tiny",
        checkpoint_hash="0123456789abcdef",
        created_at="2026-01-01T00:00:00+00:00",
        source_uri=source_uri,
    )
    rng = np.random.default_rng(0)
    profile = VoiceProfile(
        summary=summary,
        speech_tokens=rng.integers(0, 6561, 3).astype(np.int32),
        mel=rng.standard_normal((6, 80)).astype(np.float32),
        embedding=rng.standard_normal(192).astype(np.float32),
    )
    VoiceRegistry(connection).save(profile)


def finish_with_uri(connection: redis.Redis, job_id: str, uri: str) -> None:
    """A finished job whose result, as stored in Redis, names `uri` (rewritten there)."""
    result = SynthesisResult(
        job_id=job_id,
        uri=uri,
        bytes=len(KEEP),
        sha256="0" * 64,
        format="wav",
        sample_rate=RATE,
        duration_s=1.0,
        timings=StageTimings(total_s=1.0),
        rtf=1.0,
        model=ModelInfo(name="cosyq-tiny", checkpoint_hash="abc"),
        backend="torch",
        device="cpu",
        worker_name="w1",
        worker_pid=1,
        attempt=1,
    )
    job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
    Result.create(job, Result.Type.SUCCESSFUL, ttl=600, return_value=result.model_dump(mode="json"))
    connection.hset(f"rq:job:{job_id}", "status", "finished")


@pytest.mark.parametrize("where", ["outside", "sibling", "s3"])
def test_say_refuses_a_result_outside_its_storage_and_leaves_the_file(
    settings: Settings,
    connection: redis.Redis,
    tmp_path: Path,
    where: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A result naming a file outside COSYQ_STORAGE_URL (rewritten in Redis, or a worker on
    another storage) is not read into --out: one clear line, exit 1, the file as it was."""
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"not audio of this job")
    uri = {
        "outside": secret.as_uri(),
        "sibling": (tmp_path / "audio-other" / "x.wav").as_uri(),
        "s3": "s3://minio:s3-pass-9K@bucket/x.wav",
    }[where]
    keep = tmp_path / "keep.wav"
    keep.write_bytes(KEEP)
    worker = as_worker(connection, lambda c, job_id: finish_with_uri(c, job_id, uri))
    assert cosyq("say", "Hello.", "--out", str(keep), "--timeout", "30") == 1
    worker.join(timeout=30)
    line = one_line(capsys.readouterr().err)
    assert "not under COSYQ_STORAGE_URL" in line and "s3-pass-9K" not in line, line
    assert keep.read_bytes() == KEEP
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".keep")] == []


def test_say_refuses_a_file_a_later_job_replaced_and_leaves_the_file(
    settings: Settings, connection: redis.Redis, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The result's file now holds another job's audio (a later job given the same output_key
    replaced it before `say` read it): not written to --out, one line, exit 1."""
    replaced = tmp_path / "audio" / "same.wav"
    replaced.parent.mkdir(parents=True)
    replaced.write_bytes(b"RIFF a later job's audio")
    keep = tmp_path / "keep.wav"
    keep.write_bytes(KEEP)
    worker = as_worker(connection, lambda c, job_id: finish_with_uri(c, job_id, replaced.as_uri()))
    assert cosyq("say", "Hello.", "--out", str(keep), "--timeout", "30") == 1
    worker.join(timeout=30)
    line = one_line(capsys.readouterr().err)
    assert "now holds another job's audio" in line and "output_key" in line, line
    assert keep.read_bytes() == KEEP
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".keep")] == []


def test_document_result_refuses_a_file_outside_its_storage_and_writes_none(
    settings: Settings, connection: redis.Redis, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One of a document's four files named outside COSYQ_STORAGE_URL: none is written."""
    out = tmp_path / "audio"
    document_id = synthetic_document(connection, out, minutes=1)
    assemble(connection, FileStorage(settings, out), settings, document_id, "a")
    capsys.readouterr()  # what the assembler logged (to a stream an earlier test configured)
    result_key = f"cosyq:document:{document_id}:result"
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"not a caption of this document")
    rewritten = {**json.loads(connection.get(result_key) or b""), "vtt_uri": secret.as_uri()}
    connection.set(result_key, json.dumps(rewritten), keepttl=True)
    target = tmp_path / "mine" / "doc.mp3"
    assert cosyq("document", "result", document_id, "--out", str(target)) == 1
    assert "not under COSYQ_STORAGE_URL" in one_line(capsys.readouterr().err)
    assert not target.parent.exists() or list(target.parent.iterdir()) == []
