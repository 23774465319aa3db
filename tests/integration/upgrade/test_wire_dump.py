"""scripts/wire_fixtures.py's dump of a tiny Redis: two runs of one release, their clocks,
TTLs, stream ids, worker names and measured timings apart, write the same text; what the
values mean is kept (order of a job's times, expiries a TTL ahead, semantic durations), and
tests/doubles/wire.py puts the instants back at the time it loads them."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import socket
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType

import pytest
import redis

from tests.doubles import wire

SCRIPTS = wire.ROOT / "scripts"
EPOCH = wire.normalise.EPOCH
HOST = socket.gethostname().split(".")[0]


@pytest.fixture
def fixtures_script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(SCRIPTS))  # it imports wire_normalise beside it
    spec = importlib.util.spec_from_file_location("wire_fixtures", SCRIPTS / "wire_fixtures.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.delitem(sys.modules, "wire_normalise", raising=False)
    return module


@pytest.fixture
def connection(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat().replace("+00:00", "Z")


def one_run(connection: redis.Redis, script: ModuleType, root: Path, rng: random.Random) -> str:
    """What a release's run writes, at this moment, with this run's jitter; its dump's text."""
    connection.flushdb()
    seconds, micros = connection.time()
    t0 = seconds + micros / 1e6
    at = [t0 + 0.001 * (n + 1) + rng.uniform(0, 0.0004) for n in range(4)]
    worker = f"{HOST}.{os.getpid() + rng.randrange(1000)}.{rng.randrange(1 << 16):04x}"
    day = datetime.fromtimestamp(t0, UTC).strftime("%Y/%m/%d")
    result = {
        "uri": f"{(root / 'out').as_uri()}/tenants/acme/{day}/j1.wav",
        "duration_s": 0.05,
        "rtf": rng.random(),
        "timings": {"total_s": rng.random(), "llm_s": rng.random() * 1e-5},
    }
    connection.hset("rq:job:j1", mapping={"enqueued_at": iso(at[0]), "started_at": iso(at[1]),
                                          "ended_at": iso(at[2]), "worker_name": worker,
                                          "status": "finished"})  # fmt: skip
    connection.set("rq:results:j1", json.dumps(result), px=86_400_000 - rng.randrange(900))
    connection.zadd("rq:finished:q", {"j1": int(at[2] + 86400)})
    connection.zadd("cosyq:index:jobs", {"j1": at[0]})
    connection.set("cosyq:idem:k", f"j1 {int(at[0])} {int(at[0])}", ex=86400)
    for chunk in (b"\x00\x01", b"\x02\x03"):
        connection.xadd("cosyq:audio:j1", {"pcm": chunk})
    connection.hset(f"cosyq:worker-stats:{worker}", mapping={"pid": "12", "host": HOST})
    connection.hset(f"cosyq:throughput:{int(at[3]) // 60}", "jobs", 1)
    return json.dumps(script.dump(connection, root, t0), indent=1, sort_keys=True)


def test_two_runs_dump_the_same_text_and_the_meaning_is_kept(
    connection: redis.Redis, fixtures_script: ModuleType, tmp_path: Path
) -> None:
    first = one_run(connection, fixtures_script, tmp_path, random.Random(1))
    second = one_run(connection, fixtures_script, tmp_path, random.Random(2))
    assert first == second
    keys = {entry["key"]: entry for entry in json.loads(first)}
    job = keys["rq:job:j1"]["value"]
    assert job["enqueued_at"] < job["started_at"] < job["ended_at"]  # order kept
    assert job["enqueued_at"].startswith("2002-01-01T00:00:00.") and job["worker_name"] == (
        "worker-1"
    )
    assert keys["rq:finished:q"]["value"] == [["j1", float(EPOCH + 1 + 86400)]]
    assert keys["cosyq:idem:k"]["value"] == f"j1 {EPOCH} {EPOCH}"
    assert keys["cosyq:idem:k"]["ttl_ms"] == keys["rq:results:j1"]["ttl_ms"] == 86_400_000
    result = json.loads(keys["rq:results:j1"]["value"])
    assert result["uri"] == "{storage_uri}/tenants/acme/2002/01/01/j1.wav"
    assert result["duration_s"] == 0.05  # the audio's length: the same at every run
    assert result["rtf"] == result["timings"]["total_s"] == result["timings"]["llm_s"] == 0.001
    assert [i for i, _ in keys["cosyq:audio:j1"]["value"]] == [
        f"{EPOCH * 1000 + 1}-0",
        f"{EPOCH * 1000 + 2}-0",
    ]
    assert keys["cosyq:worker-stats:worker-1"]["value"] == {"host": "host", "pid": "0"}
    assert f"cosyq:throughput:{EPOCH // 60}" in keys


def test_the_loader_puts_the_instants_back_at_its_own_time(
    connection: redis.Redis, fixtures_script: ModuleType, tmp_path: Path
) -> None:
    dumped = json.loads(one_run(connection, fixtures_script, tmp_path, random.Random(3)))
    connection.flushdb()
    fixture = wire.Fixture("tiny", {}, dumped, {}, {}, EPOCH)
    wire.restore(connection, fixture, tmp_path / "out", {}, age_s=60)
    seconds, _ = connection.time()
    ended = datetime.fromisoformat(connection.hget("rq:job:j1", "ended_at").decode())  # type: ignore[union-attr]
    assert abs(ended.timestamp() - (seconds - 60)) < 5  # dumped a minute ago
    expiry = connection.zscore("rq:finished:q", "j1")
    assert expiry is not None and abs(expiry - (seconds - 60 + 86400)) < 5
    assert 86_400_000 - 60_000 - 5000 < connection.pttl("cosyq:idem:k") <= 86_400_000 - 60_000
    assert len(connection.xrange("cosyq:audio:j1")) == 2
    claimed = connection.get("cosyq:idem:k").split()  # type: ignore[union-attr]
    assert abs(int(claimed[1]) - (seconds - 60)) < 5
    minutes = [int(k.rsplit(b":", 1)[1]) for k in connection.keys("cosyq:throughput:*")]
    assert len(minutes) == 1 and abs(minutes[0] - (seconds - 60) // 60) <= 1


def test_a_seed_that_looks_like_a_time_is_kept() -> None:
    """A request's seed is any 32-bit number: one in a run's year of Unix seconds stays."""
    start = datetime.now(UTC).timestamp()
    normaliser = wire.normalise.Normaliser(start=start, end=start + 1, host=HOST)
    seed = int(start)
    for text in (
        json.dumps({"seed": seed, "at": seed}),
        json.dumps(json.dumps({"seed": seed, "at": seed})),
        json.dumps(json.dumps(json.dumps({"seed": seed, "at": seed}))),
    ):
        normalised = normaliser.text(text)
        assert str(seed) in normalised and str(EPOCH) in normalised, normalised
