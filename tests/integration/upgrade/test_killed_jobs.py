"""Workers upgraded after an earlier release's worker was SIGKILLed holding its jobs: a lone
worker mid-job (a speech job with an idempotency key and a webhook), another mid-segment of a
document, a batching worker (COSYQ_BATCH_SIZE=2) holding a batch of two (tests/data/wire/
<release>/started.json, scripts/wire_fixtures.py). The current worker's reaper finds their
heartbeats gone and gives each job back; each then finishes once, its webhook and its
document told once."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from producer import CosyqClient
from shared import keys
from shared.job_events import WebhookPolicy
from tests.doubles import wire
from tests.doubles.rq_workers import run_cosyq_burst
from tests.integration.upgrade.conftest import Upgraded

pytestmark = pytest.mark.parametrize("release", wire.RELEASES)
# The killed workers' COSYQ_HEARTBEAT_TTL_S (scripts/wire_fixtures.py): put back a second later,
# their heartbeats have expired, as when the upgraded workers start after the dead ones.
HEARTBEAT_TTL_S = 300
JOBS = ("killed", "killed_segment", "batch_killed", "batch_held")
TOLD = ("killed", "batch_held")  # the jobs that asked for a webhook


def killed_earlier(
    upgrade: Callable[..., Upgraded], release: str, tmp_path: Path, age_s: float
) -> Upgraded:
    """started.json put back `age_s` after the kill, the killed attempts' `once:` markers
    written (the engine skips its `kill` from then on), and the current worker run once."""
    marks = tmp_path / "m"
    marks.mkdir()
    for attempted in ("a", "d", "b"):
        (marks / attempted).touch()
    old = upgrade(release, "started", {"{scratch}": str(tmp_path)}, age_s=age_s)
    run_cosyq_burst(old.settings, queues=())
    return old


def assert_finished_once(old: Upgraded, roles: tuple[str, ...]) -> None:
    """Each job finished by one execution, its second attempt (the killed one, then this),
    no heartbeat or started entry left; its webhook, if any, told once that it finished."""
    connection, ids = old.connection, old.fixture.ids
    with CosyqClient(old.settings) as client:
        states = {role: client.status(ids[role]).state for role in roles}
        durations = [client.result(ids[role], timeout=0).duration_s for role in roles]
    assert states == dict.fromkeys(roles, "finished") and min(durations) > 0
    events = [f for _, f in connection.xrange(keys.WEBHOOK_OUTBOX)]
    for role in roles:
        job_id = ids[role]
        assert connection.xlen(f"rq:results:{job_id}") == 1, role
        meta = json.loads(connection.hget(f"rq:job:{job_id}", "meta"))  # type: ignore[arg-type]
        assert meta[keys.ATTEMPT_META_KEY] == 2, role
        assert connection.get(keys.job_heartbeat_key(job_id)) is None
        told = [f[b"event"] for f in events if f[b"job_id"] == job_id.encode()]
        assert told == ([b"job.finished"] if role in TOLD else []), (role, told)
    assert not [k for k in connection.keys("rq:wip:*") if connection.zcard(k)]


def test_jobs_an_earlier_worker_was_killed_holding_finish_once_on_the_current_worker(
    release: str, upgrade: Callable[..., Upgraded], tmp_path: Path
) -> None:
    old = killed_earlier(upgrade, release, tmp_path, HEARTBEAT_TTL_S + 1)
    assert_finished_once(old, JOBS)
    ids = old.fixture.ids
    with CosyqClient(old.settings) as client:
        document = client.document_result(ids["killed_document"], timeout=0)
        assert client.document_status(ids["killed_document"]).state == "assembled"
        request = old.fixture.call(ids["killed"])[2]["request"]
        assert client.submit(request) == ids["killed"]  # its idempotency key still holds
    assert document.segments == 1 and Path(document.uri.removeprefix("file://")).is_file()


def test_a_segment_whose_document_expired_meanwhile_fails_saying_so(
    release: str, upgrade: Callable[..., Upgraded], tmp_path: Path
) -> None:
    """Upgraded a day and an hour after the kill: the document's plan has expired (its TTL
    is COSYQ_RESULT_TTL_S), so its segment fails for good with that reason; the jobs, whose
    hashes a started job keeps, finish once as before."""
    old = killed_earlier(upgrade, release, tmp_path, 86400 + 3600)
    assert_finished_once(old, ("killed", "batch_killed", "batch_held"))
    segment = old.fixture.ids["killed_segment"]
    with CosyqClient(old.settings) as client:
        status = client.status(segment)
    assert status.state == "failed" and status.failure is not None
    assert "expired" in status.failure.message and "submit the document again" in (
        status.failure.message
    )
    assert old.connection.xlen(f"rq:results:{segment}") == 1  # the failure, once


def test_two_upgraded_workers_reaping_at_once_give_each_job_back_once(
    release: str, upgrade: Callable[..., Upgraded], tmp_path: Path
) -> None:
    """A pool's workers start together, each reaping at start-up: whoever removes a started
    entry owns its job, so each killed job is back in its queue once, never run twice."""
    from workers.service.reaper import Reaper  # noqa: PLC0415 (the worker's side)

    old = upgrade(release, "started", {"{scratch}": str(tmp_path)}, age_s=HEARTBEAT_TTL_S + 1)
    names = [k.decode().removeprefix("rq:queue:") for k in old.connection.smembers("rq:queues")]
    start = threading.Barrier(2)
    reaped: list[list[str]] = [[], []]

    def reap(slot: int) -> None:
        connection = redis.Redis.from_url(old.settings.redis_url)
        webhooks = WebhookPolicy.from_settings(old.settings)
        reaper = Reaper(connection, names, heartbeat_ttl_s=10, webhooks=webhooks)
        start.wait(timeout=30)
        reaped[slot] = [r.job_id for r in reaper.reap()]
        connection.close()

    threads = [threading.Thread(target=reap, args=(slot,)) for slot in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    ids = old.fixture.ids
    assert sorted(reaped[0] + reaped[1]) == sorted(ids[role] for role in JOBS)
    queued = [
        job_id.decode()
        for name in names
        for job_id in old.connection.lrange(f"rq:queue:{name}", 0, -1)
    ]
    assert sorted(queued) == sorted(ids[role] for role in JOBS)  # each once
