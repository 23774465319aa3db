"""The operator page's indexes on a real Redis: a page is a range of the index, a tenant's index
holds only its own jobs, old entries are trimmed, suspects wait until judged, throughput counts
per minute, and stopped workers stay listed for a while."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from rq.job import Job

from producer import CosyqClient
from producer.http.ui.listing import JobFilter, job_page
from shared import keys
from shared.job_index import (
    TRIM_BATCH,
    Outcome,
    count_ids,
    index_jobs,
    judgement_of,
    owned,
    page_ids,
    record_failure,
    record_outcome,
    record_stopped_worker,
    save_judgement,
    stopped_workers,
    summaries,
    throughput,
)
from shared.settings import load_settings


def test_pages_are_ranges_of_the_tenant_index_newest_first(redis_url: str) -> None:
    connection = redis.Redis.from_url(redis_url)
    index_jobs(connection, "acme", [f"a{i}" for i in range(5)], keep_s=100, at=1000.0)
    index_jobs(connection, "acme", ["a-late"], keep_s=100, at=1010.0)
    index_jobs(connection, "other", ["o1"], keep_s=100, at=1020.0)

    acme = page_ids(connection, keys.JOB_INDEX, "acme", offset=0, count=3)
    assert acme[0][0] == "a-late" and len(acme) == 3
    assert {
        job_id for job_id, _ in page_ids(connection, keys.JOB_INDEX, "acme", offset=0, count=99)
    } == {
        *(f"a{i}" for i in range(5)),
        "a-late",
    }
    assert [j for j, _ in page_ids(connection, keys.JOB_INDEX, None, offset=0, count=1)] == ["o1"]
    since = page_ids(connection, keys.JOB_INDEX, None, offset=0, count=99, since=1005.0)
    assert {job_id for job_id, _ in since} == {"a-late", "o1"}

    index_jobs(connection, "acme", ["a-new"], keep_s=100, at=1105.0)  # trims what is > 100 s old
    assert count_ids(connection, keys.JOB_INDEX, "acme") == 2
    assert count_ids(connection, keys.JOB_INDEX, "other") == 1  # its own index is its own


def test_suspects_wait_until_judged_and_minutes_count(redis_url: str) -> None:
    connection = redis.Redis.from_url(redis_url)
    record_outcome(connection, Outcome("j1", "acme", 2.5, "suspect", 60), at=600.0)
    record_outcome(connection, Outcome("j2", "acme", 1.5, "ok", 60), at=610.0)
    record_failure(connection, "acme", at=615.0)
    record_outcome(connection, Outcome("b1", "beta", 9.0, "ok", 60), at=612.0)
    assert connection.zrange(keys.SUSPECT_INDEX + ":acme", 0, -1) == [b"j1"]
    assert connection.zrange(keys.SUSPECT_INDEX, 0, -1) == [b"j1"]
    assert [s.get("verdict") for s in summaries(connection, ["j1", "j2", "gone"])] == [
        "suspect",
        "ok",
        None,
    ]
    minute = throughput(connection, "acme", minutes=2, now=650.0)[-1]
    assert (minute.jobs, minute.audio_s, minute.failed) == (2, 4.0, 1)  # acme's alone
    fleet = throughput(connection, minutes=2, now=650.0)[-1]
    assert (fleet.jobs, fleet.audio_s, fleet.failed) == (3, 13.0, 1)

    save_judgement(connection, "j1", "acme", {"action": "accepted", "by": "ann"}, keep_s=60)
    assert connection.zcard(keys.SUSPECT_INDEX + ":acme") == 0
    assert connection.zcard(keys.SUSPECT_INDEX) == 0
    assert judgement_of(connection, "j1") == {"action": "accepted", "by": "ann"}


def test_stopped_workers_are_listed_for_an_hour(redis_url: str) -> None:
    connection = redis.Redis.from_url(redis_url)
    record_stopped_worker(connection, "w-old", {"host": "h", "jobs_done": "3"}, at=1000.0)
    record_stopped_worker(connection, "w-new", {"host": "h", "jobs_done": "7"}, at=4000.0)
    found = stopped_workers(connection, now=4700.0)
    assert [(w["host"], w["jobs_done"]) for w in found] == [("h", "7")]
    assert connection.hkeys(keys.STOPPED_WORKER_STATS) == [b"w-new"]  # the old one pruned


def test_stopped_workers_stats_go_with_them_when_no_one_reads_the_fleet_view(
    redis_url: str,
) -> None:
    """A fleet nobody watches on /ui: every recycle records its worker, and the ones past the
    hour leave the hash too, not the sorted set alone (the hash grew by one field a recycle);
    stats an older release left with no name in the set go as well."""
    connection = redis.Redis.from_url(redis_url)
    connection.hset(keys.STOPPED_WORKER_STATS, "w-stray", "{}")  # an older release's leftover
    for i in range(50):
        record_stopped_worker(connection, f"w-{i}", {"host": "h"}, at=1000.0 + 600 * i)
    kept = {f"w-{i}".encode() for i in range(43, 50)}  # the last hour, its ends included
    assert set(connection.zrange(keys.STOPPED_WORKERS, 0, -1)) == kept
    assert set(connection.hkeys(keys.STOPPED_WORKER_STATS)) == kept


def test_an_old_entry_goes_only_once_its_job_has_expired(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job still queued (or failed, or running) past its submit time + the TTL stays in its
    tenant's list and the operators'; one whose RQ hash expired is trimmed at the next submit."""
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_STORAGE_URL", (tmp_path / "audio").as_uri())
    monkeypatch.setenv("COSYQ_TENANTS", "alpha")
    monkeypatch.chdir(tmp_path)  # no stray .env
    settings = load_settings(env_file=None)
    with CosyqClient(settings, tenant="alpha") as alpha:
        connection = alpha.connection
        waiting, expired = (alpha.submit({"text": "Still waiting."}) for _ in range(2))
        long_ago = time.time() - 2 * max(settings.result_ttl_s, settings.failure_ttl_s)
        for index in (keys.JOB_INDEX, owned(keys.JOB_INDEX, "alpha")):
            connection.zadd(index, dict.fromkeys((waiting, expired), long_ago))
        connection.delete(Job.key_for(expired))  # its TTL ran out

        newest = alpha.submit({"text": "The newest."})  # trims the index as it adds
        for tenant in ("alpha", None):
            wanted = JobFilter("", "", "", "", None)
            page = job_page(connection, tenant, wanted, offset=0, size=50, scan_limit=100)
            assert [row.job_id for row in page.rows] == [newest, waiting]
            assert connection.zscore(owned(keys.JOB_INDEX, tenant), expired) is None


def test_the_trim_goes_on_past_old_entries_whose_jobs_still_live(redis_url: str) -> None:
    """Each submit looks at a bounded batch of old entries, from where the last one stopped:
    more live old jobs than a batch never hide the expired ones behind them for good."""
    connection = redis.Redis.from_url(redis_url)
    live = [f"live{n:05d}" for n in range(TRIM_BATCH + 200)]
    gone = [f"gone{n}" for n in range(10)]
    pipe = connection.pipeline(transaction=False)
    for job_id in live:
        pipe.hset(Job.key_for(job_id), "status", "queued")
    pipe.execute()
    index_jobs(connection, "acme", live, keep_s=100, at=1000.0)
    index_jobs(connection, "acme", gone, keep_s=100, at=1001.0)

    index_jobs(connection, "acme", ["new1"], keep_s=100, at=2000.0)  # looks at live ones only
    assert count_ids(connection, keys.JOB_INDEX, "acme") == len(live) + len(gone) + 1
    index_jobs(connection, "acme", ["new2"], keep_s=100, at=2000.0)  # goes on to the rest
    listed = page_ids(connection, keys.JOB_INDEX, "acme", offset=0, count=len(live) + 99)
    assert {job_id for job_id, _ in listed} == {*live, "new1", "new2"}
