"""`cosyq submit` when Redis runs out of memory or restarts: ids printed as they go in, the
--results file written as outcomes arrive, the wait riding out the restart, and a summary that
tells still-running jobs from failed ones. Real redis-servers and a real `cosyq` process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from producer import CosyqClient
from producer.cli import main
from shared import keys
from shared.keys import QUEUES_IN_PRIORITY_ORDER
from shared.settings import Settings, load_settings
from tests.doubles.harness import write_model_dir
from tests.doubles.rq_workers import REPO_ROOT, run_cosyq_burst
from workers.tools.local_redis import LocalRedis

CLI = "import sys; from producer.cli import main; sys.exit(main(sys.argv[1:]))"


def cosyq(*argv: str) -> int:
    return main(list(argv))


def wait_for(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def env_for(url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYQ_")}
    env.update(
        COSYQ_REDIS_URL=url,
        COSYQ_STORAGE_URL=(tmp_path / "audio").as_uri(),
        COSYQ_MAX_RETRIES="0",
        COSYQ_ENGINE="tests.doubles.engines:fast",
        COSYQ_MODEL_DIR=str(write_model_dir(tmp_path / "model")),
        PYTHONPATH=str(REPO_ROOT),
        **extra,
    )
    return env


def burst(url: str, *queues: str) -> None:
    """Run the queued jobs of `queues` (all of them by default) with the real worker, here."""
    settings = load_settings(env_file=None).model_copy(update={"redis_url": url})
    run_cosyq_burst(settings, queues or QUEUES_IN_PRIORITY_ORDER)


@pytest.fixture
def persistent_redis(tmp_path: Path) -> Iterator[LocalRedis]:
    server = LocalRedis(tmp_path / "redis", persistent=True)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def settings(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for name, value in env_for(redis_url, tmp_path).items():
        if name.startswith("COSYQ_"):
            monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    return load_settings(env_file=None)


def test_out_of_memory_names_the_chunk_and_prints_every_id_that_went_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with LocalRedis(tmp_path / "redis") as server:
        connection = redis.Redis.from_url(server.url)
        used = int(connection.info("memory")["used_memory"])
        connection.config_set("maxmemory", used + 1_000_000)
        connection.config_set("maxmemory-policy", "noeviction")
        for name, value in env_for(server.url, tmp_path, COSYQ_SUBMIT_CHUNK_SIZE="100").items():
            if name.startswith("COSYQ_"):
                monkeypatch.setenv(name, value)
        monkeypatch.chdir(tmp_path)
        batch = tmp_path / "batch.jsonl"
        batch.write_text(
            "".join(json.dumps({"text": f"Sentence {i}."}) + "\n" for i in range(2000))
        )
        assert cosyq("submit", str(batch)) == 1
        captured = capsys.readouterr()
        printed = captured.out.split()
        queued = [i.decode() for i in connection.lrange("rq:queue:" + keys.QUEUE_DEFAULT, 0, -1)]
        assert 0 < len(printed) < 2000 and len(printed) % 100 == 0  # whole chunks only
        assert printed == queued  # every id that went in, and only those, in order
        assert (
            f"Redis is out of memory (maxmemory): the chunk of requests {len(printed) + 1:,}-"
            f"{len(printed) + 100:,} was refused; {len(printed):,} of the 2,000 jobs went in "
            "before it"
        ) in captured.err
        assert f"not submitted: lines {len(printed) + 1}-2000" in captured.err
        assert "HSET" not in captured.err and "data" not in captured.err  # no job bytes
        connection.close()


def test_wait_rides_out_a_restart_and_writes_results_as_they_come(
    persistent_redis: LocalRedis, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = persistent_redis.url
    for name, value in env_for(url, tmp_path).items():  # for the jobs run in this process
        if name.startswith("COSYQ_"):
            monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    lines = [{"text": f"High {i}.", "priority": "high"} for i in range(3)]
    lines += [{"text": f"Low {i}.", "priority": "low"} for i in range(3)]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out, err, results = tmp_path / "out.txt", tmp_path / "err.txt", tmp_path / "r.jsonl"
    argv = ["submit", "b.jsonl", "--wait", "--results", str(results), "--timeout", "120"]
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-c", CLI, *argv],
            cwd=tmp_path,
            env=env_for(url, tmp_path),
            stdout=stdout,
            stderr=stderr,
        )
    try:
        wait_for(lambda: len(out.read_text().split()) == 6, 30, "the ids, printed up front")
        ids = out.read_text().split()
        burst(url, keys.QUEUE_HIGH)
        wait_for(lambda: results.exists() and len(results.read_text().splitlines()) == 3, 30, "3")
        early = [json.loads(line) for line in results.read_text().splitlines()]
        assert sorted(r["line"] for r in early) == [1, 2, 3]
        assert all(r["status"] == "ok" for r in early)
        persistent_redis.stop()
        time.sleep(3)
        assert process.poll() is None, err.read_text()  # still waiting, not dead
        assert "Redis unreachable" in err.read_text()
        persistent_redis.start()
        burst(url)
        assert process.wait(timeout=60) == 0, err.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    messages = err.read_text()
    assert messages.count("Redis unreachable") == 1 and messages.count("Redis is back") == 1
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted(r["line"] for r in records) == [1, 2, 3, 4, 5, 6]
    assert all(r["status"] == "ok" for r in records)
    assert {r["job_id"] for r in records} == set(ids)


def test_summary_counts_still_running_apart_from_failed(
    settings: Settings, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with CosyqClient(settings) as client:
        done = client.submit({"text": "Done already.", "idempotency_key": "k1"})
        burst(settings.redis_url)
    capsys.readouterr()  # the worker's own log lines
    lines = [{"text": "Done already.", "idempotency_key": "k1"}, {"text": "Nobody runs me."}]
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    results = tmp_path / "r.jsonl"
    status = cosyq("submit", "b.jsonl", "--wait", "--timeout", "0.5", "--results", str(results))
    captured = capsys.readouterr()
    assert status == 3  # nothing failed; one job is still queued
    table = captured.out.splitlines()
    header = next(line for line in table if "still running" in line)
    row = table[table.index(header) + 2]
    columns = [c.strip() for c in header.split("┃")][1:-1]
    cells = dict(zip(columns, (c.strip() for c in row.split("│")[1:-1]), strict=True))
    assert (cells["ok"], cells["failed"], cells["still running"]) == ("1", "0", "1")
    assert "1 job still queued or running when the wait ended" in captured.err
    assert "failed:" not in captured.err
    records = {r["line"]: r for r in map(json.loads, results.read_text().splitlines())}
    assert records[1]["status"] == "ok" and records[1]["job_id"] == done
    assert records[2]["status"] == "pending"
