"""The `cosyq` command line against real Redis and the real worker (a test engine inside)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import soundfile as sf

from producer import CosyqClient
from producer.cli import main
from shared import keys
from shared.audio import decode_audio
from shared.settings import Settings, load_settings
from tests.doubles.engines import per_char_seconds
from tests.doubles.harness import write_model_dir
from tests.doubles.redis_servers import secured_redis
from tests.doubles.rq_workers import run_cosyq_burst, start_worker_process, stop_worker_process


@pytest.fixture
def settings(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_STORAGE_URL", (tmp_path / "audio").as_uri())
    monkeypatch.setenv("COSYQ_MAX_RETRIES", "0")
    monkeypatch.setenv("COSYQ_ENGINE", "tests.doubles.engines:per_char")  # audio follows the text
    monkeypatch.setenv("COSYQ_MODEL_DIR", str(write_model_dir(tmp_path / "model")))
    monkeypatch.chdir(tmp_path)  # no stray .env
    return load_settings(env_file=None)


@pytest.fixture
def worker(settings: Settings) -> Iterator[subprocess.Popen[bytes]]:
    process = start_worker_process(settings.redis_url, burst=False)
    yield process
    stop_worker_process(process)


def cosyq(*argv: str) -> int:
    return main(list(argv))


def write_batch(path: Path) -> dict[int, str]:
    """100 lines, 6 of them bad; returns line number -> expected problem."""
    bad = {
        7: ("{not json", "line 7: not JSON (Expecting property name enclosed in double quotes"),
        23: (json.dumps({"text": "   "}), "line 23: text: must not be empty"),
        48: (json.dumps({"text": "hi", "speed": 9}), "line 48: speed: 9.0 is outside 0.5-2.0"),
        61: (json.dumps({"text": "hi", "colour": "red"}), "line 61: colour: unknown field"),
        77: (json.dumps({"text": "hi", "voice": "nobody"}), "line 77: voice: no voice named"),
        90: (json.dumps({"text": "hi", "output_key": "../x"}), "line 90: output_key: '..'"),
    }
    lines = []
    for number in range(1, 101):
        if number in bad:
            lines.append(bad[number][0])
        else:
            request: dict[str, Any] = {"text": f"Line {number} says hello.", "format": "wav"}
            if number % 3 == 0:
                request.update(format="flac", sample_rate=16000, priority="low")
            lines.append(json.dumps(request))
    path.write_text("\n".join(lines) + "\n")
    return {number: message for number, (_, message) in bad.items()}


def test_submit_100_lines_with_bad_ones_and_wait(
    settings: Settings,
    worker: subprocess.Popen[bytes],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bad = write_batch(tmp_path / "batch.jsonl")
    out_path = tmp_path / "results.jsonl"
    status = cosyq("submit", str(tmp_path / "batch.jsonl"), "--wait", "--results", str(out_path))
    captured = capsys.readouterr()
    assert status == 1  # bad lines make the run unclean, the rest was done
    for message in bad.values():
        assert message in captured.err
    assert "submitted 94 jobs; 6 bad lines skipped" in captured.err
    summary = captured.out
    for column in ("ok", "failed", "audio s", "wall s", "audio s / wall s", "jobs / s"):
        assert column in summary
    row = [line for line in summary.splitlines() if line.strip().startswith("│ 94")]
    assert row and row[0].split("│")[2].strip() == "0"  # ok 94, failed 0
    records = [json.loads(line) for line in out_path.read_text().splitlines()]
    assert sorted(r["line"] for r in records) == [n for n in range(1, 101) if n not in bad]
    assert all(r["status"] == "ok" for r in records)
    flac = next(r for r in records if r["line"] == 3)["result"]
    assert (flac["format"], flac["sample_rate"]) == ("flac", 16000)
    samples, rate = decode_audio(Path(flac["uri"].removeprefix("file://")).read_bytes())
    assert rate == 16000 and samples.size == round(per_char_seconds("Line 3 says hello.") * 16000)


def test_submit_without_wait_prints_one_id_per_submitted_line(
    settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_batch(tmp_path / "batch.jsonl")
    assert cosyq("submit", str(tmp_path / "batch.jsonl")) == 1
    ids = capsys.readouterr().out.split()
    assert len(ids) == 94 and len(set(ids)) == 94
    client = redis.Redis.from_url(settings.redis_url)
    assert client.llen("rq:queue:cosyq-default") + client.llen("rq:queue:cosyq-low") == 94


def test_failures_are_reported_with_reasons(
    settings: Settings,
    worker: subprocess.Popen[bytes],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = [{"text": "fine"}, {"text": "doomed fail: engine on fire"}]  # the engine raises
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    results = tmp_path / "r.jsonl"
    assert cosyq("submit", str(tmp_path / "b.jsonl"), "--wait", "--results", str(results)) == 1
    captured = capsys.readouterr()
    assert "line 2 (job " in captured.err
    assert "failed: internal: RuntimeError: engine on fire" in captured.err
    first, second = sorted(
        (json.loads(line) for line in results.read_text().splitlines()), key=lambda r: r["line"]
    )
    assert first["status"] == "ok" and second["status"] == "failed"
    assert second["error"] == {"kind": "internal", "message": "RuntimeError: engine on fire"}
    job_id = second["job_id"]

    assert cosyq("failed") == 0
    assert "engine on fire" in capsys.readouterr().out
    assert cosyq("status") == 0
    status_out = capsys.readouterr().out
    assert "cosyq-default" in status_out and "engine on fire" in status_out

    assert cosyq("result", job_id) == 1
    assert json.loads(capsys.readouterr().out)["error"]["message"] == (
        "RuntimeError: engine on fire"
    )
    stop_worker_process(worker)  # nothing may run the requeued job before we look
    assert cosyq("failed", "--requeue") == 0
    assert "requeued 1 job\n" in capsys.readouterr().out
    assert redis.Redis.from_url(settings.redis_url).lrange("rq:queue:cosyq-default", 0, -1) == [
        job_id.encode()
    ]


def test_a_canceled_document_counts_its_segments_in_the_singular_too(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    """`cosyq document status` of a canceled one-segment document said "1 segments"."""
    with CosyqClient(settings) as client:  # no worker: the segment is canceled while queued
        document_id = client.submit_document({"text": "One short sentence."})
        client.cancel_document(document_id)
    assert cosyq("document", "status", document_id) == 1
    assert f"document {document_id}: canceled (1 segment did not run)" in capsys.readouterr().err


def test_say_writes_the_audio(
    settings: Settings,
    worker: subprocess.Popen[bytes],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "hello.ogg"
    assert cosyq("say", "Hello there, world.", "--out", str(out), "--seed", "4") == 0
    assert f"wrote {out}" in capsys.readouterr().out
    samples, rate = decode_audio(out.read_bytes())
    assert rate == 24000 and samples.size == round(per_char_seconds("Hello there, world.") * 24000)
    assert cosyq("say", "x", "--out", str(tmp_path / "a.aac")) == 2  # usage
    assert "--out: .aac is not one of wav, flac, ogg, mp3, opus" in capsys.readouterr().err
    opus = tmp_path / "hello.opus"
    assert cosyq("say", "Hello.", "--out", str(opus)) == 0
    assert sf.info(str(opus)).subtype == "OPUS"


def test_submit_lines_and_say_take_markup_plain(
    settings: Settings,
    worker: subprocess.Popen[bytes],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A line or a `say` with angle brackets as words: refused as auto (the reason names
    plain), spoken as plain (the engine is given "List< String>": audio of its length)."""
    text = "A List<String> and <|user|> here."
    spoken = "A List< String> and < |user|> here."
    lines = [{"text": text, "markup": "plain"}, {"text": text}]
    (tmp_path / "plain.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert cosyq("submit", str(tmp_path / "plain.jsonl"), "--wait") == 1
    captured = capsys.readouterr()
    assert "line 2: text: contains the model's special token <|user|>" in captured.err
    assert 'send markup "plain"' in captured.err
    assert "submitted 1 job; 1 bad line skipped" in captured.err
    out = tmp_path / "plain.wav"
    assert cosyq("say", text, "--out", str(out)) == 1
    assert 'send markup "plain"' in capsys.readouterr().err and not out.exists()
    assert cosyq("say", text, "--markup", "plain", "--out", str(out)) == 0
    samples, rate = decode_audio(out.read_bytes())
    assert rate == 24000 and samples.size == round(per_char_seconds(spoken) * 24000)


def test_result_exit_codes(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    with CosyqClient(settings) as client:
        job_id = client.submit({"text": "pending"})
        assert cosyq("result", job_id) == 3
        assert json.loads(capsys.readouterr().out)["state"] == "queued"
        run_cosyq_burst(settings)
    capsys.readouterr()  # the worker's own log lines
    assert cosyq("result", job_id) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["state"] == "finished" and record["result"]["job_id"] == job_id
    assert cosyq("result", "no-such-job") == 4  # not 1: that is a failed job
    assert "no job no-such-job" in capsys.readouterr().err


def test_reasons_are_printed_as_written_not_as_rich_markup(
    settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    reason = "unreadable [func, null, args, kwargs] [bold]hash[/bold] [/]"
    with CosyqClient(settings) as client:
        client.submit({"text": f"doomed fail: {reason}"})  # the engine raises with the reason
        run_cosyq_burst(settings)
    capsys.readouterr()  # the worker's own log lines, which name the reason too
    for command in ("failed", "status"):
        assert cosyq(command) == 0
        out = capsys.readouterr().out
        flat = "".join(line.strip("│ ") for line in out.splitlines())  # cells may wrap
        assert "[func,null,args,kwargs][bold]hash[/bold][/]" in flat.replace(" ", ""), out


def test_status_shows_worker_stats(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    stats = {
        "pid": "4242",
        "rss_mb": "1536.4",
        "jobs_done": "17",
        "state": "busy",
        "current_job": "abc123",
        "backend": "coreml",
        "device": "ane",
        "started_at": "2025-01-01",
    }
    connection = redis.Redis.from_url(settings.redis_url)
    connection.hset(keys.worker_stats_key("mac-1.slot-0"), mapping=stats)
    with CosyqClient(settings) as client:
        client.submit_many([{"text": "a"}, {"text": "b", "priority": "high"}])
    assert cosyq("status") == 0
    out = capsys.readouterr().out
    assert "mac-1.slot-0" in out and "1536" in out and "coreml/ane" in out and "abc123" in out
    queue_lines = [line for line in out.splitlines() if "cosyq-high" in line]
    cells = [cell.strip() for cell in queue_lines[0].split("│")] if queue_lines else []
    assert cells[2:4] == ["default", "1"]  # queue, tenant, queued


def test_usage_and_settings_errors(
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "b.jsonl").write_text('{"text": "hi"}\n')
    assert cosyq("submit", str(tmp_path / "b.jsonl"), "--results", "r.jsonl") == 2
    assert "--results needs --wait" in capsys.readouterr().err
    assert cosyq("submit", str(tmp_path / "missing.jsonl")) == 1
    assert "missing.jsonl: cannot read" in capsys.readouterr().err
    monkeypatch.setenv("COSYQ_REDIS_UR", "redis://x")
    assert cosyq("status") == 2
    assert "did you mean COSYQ_REDIS_URL?" in capsys.readouterr().err


def test_redis_refusing_the_settings_is_exit_2_with_one_line(
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with secured_redis(tmp_path) as server:
        monkeypatch.setenv("COSYQ_REDIS_URL", server.url("alice", "not it"))
        assert cosyq("status") == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (
        f"cosyq: COSYQ_REDIS_URL (redis://alice:***@127.0.0.1:{server.port}/0): "
        "authentication failed: invalid username-password pair or user is disabled."
    )
