"""The operator page's indexes on a real Redis: a page is a range of the index, a tenant's index
holds only its own jobs, old entries are trimmed, suspects wait until judged, throughput counts
per minute, and stopped workers stay listed for a while."""

from __future__ import annotations

import redis

from shared import keys
from shared.job_index import (
    Outcome,
    count_ids,
    index_jobs,
    judgement_of,
    page_ids,
    record_failure,
    record_outcome,
    record_stopped_worker,
    save_judgement,
    stopped_workers,
    summaries,
    throughput,
)


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
