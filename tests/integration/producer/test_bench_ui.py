"""`cosyq bench ui` on a real Redis: it fills an empty database, times each /ui page over real
HTTP, prints JSON with the CPU and load, empties the database again, and refuses a database
that holds anything (it would otherwise mix its jobs into real ones)."""

from __future__ import annotations

import json

import pytest
import redis

from producer.cli import main


def test_bench_ui_times_every_page_and_leaves_the_database_empty(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    status = main(
        ["--env-file", "/nonexistent", "bench", "ui", "--jobs", "300", "--rounds", "3", "--json"]
    )
    report = json.loads(capsys.readouterr().out)
    assert report["jobs"] == 300 and report["cpu"] and len(report["load"]) == 3
    pages = {row["page"]: row for row in report["pages"]}
    assert {"fleet", "jobs (first page)", "one job"} <= set(pages)
    assert all(row["p50_ms"] > 0 for row in pages.values())
    assert status == (0 if all(row["p95_ms"] < 300 for row in pages.values()) else 1)
    assert redis.Redis.from_url(redis_url).dbsize() == 0


def test_bench_ui_refuses_a_database_in_use(
    redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    redis.Redis.from_url(redis_url).set("someone-else", "1")
    assert main(["--env-file", "/nonexistent", "bench", "ui", "--jobs", "10"]) == 2
    assert "empty" in capsys.readouterr().err
    assert redis.Redis.from_url(redis_url).get("someone-else") == b"1"
