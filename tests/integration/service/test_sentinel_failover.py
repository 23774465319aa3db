"""Redis Sentinel: a real failover (`SENTINEL FAILOVER`) while a pool works and a producer
submits; both carry on against the new master, every replicated job finishes, and a job run
twice says so in its attempt count."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from rq.job import Job
from rq.serializers import JSONSerializer

from producer import CosyqClient
from shared.connection import redis_connection
from shared.settings import load_settings
from tests.doubles.harness import Cluster, named, wait_for
from tests.doubles.sentinel import SentinelSet

BEFORE, AFTER = 16, 8


@pytest.fixture
def sentinels(tmp_path: Path) -> Iterator[SentinelSet]:
    trio = SentinelSet(tmp_path / "redis")
    trio.start()
    yield trio
    trio.stop()


def job_statuses(connection: redis.Redis, ids: list[str]) -> list[str]:
    jobs = Job.fetch_many(ids, connection=connection, serializer=JSONSerializer)
    return [str(job.get_status(refresh=False).value) if job else "missing" for job in jobs]


def test_a_failover_mid_run_loses_no_replicated_job(sentinels: SentinelSet, tmp_path: Path) -> None:
    settings = load_settings(env_file=None, redis_url=sentinels.url)
    connection = redis_connection(settings)  # follows the master, like every cosyq process
    client = CosyqClient(settings)
    before = client.submit_many([{"text": f"sleep:0.3 before {i}"} for i in range(BEFORE)])
    cluster = Cluster(redis_url=sentinels.url, root=tmp_path)
    try:
        # WAIT for the replica before each attempt: an attempt only the old master saw would
        # be forgotten by the new one, and the job would run again under the same count.
        pool = cluster.start(
            "pool",
            "-n",
            "2",
            log_name="pool.log",
            COSYQ_REDIS_WAIT_REPLICAS="1",
            COSYQ_REDIS_WAIT_TIMEOUT_S="0.5",
        )
        wait_for(lambda: job_statuses(connection, before).count("finished") >= 4, 60, "4 done")
        old_master = sentinels.client(sentinels.master_port)
        assert old_master.execute_command("WAIT", 1, 5000) == 1  # the queue reached the replica
        sentinels.failover()
        wait_for(lambda: sentinels.master_port_now() == sentinels.replica_port, 30, "failover")
        # The same client, created before the failover, submits to the new master.
        after = client.submit_many([{"text": f"sleep:0.1 after {i}"} for i in range(AFTER)])
        every = before + after
        wait_for(
            lambda: job_statuses(connection, every) == ["finished"] * len(every),
            90,
            "every job finished on the new master",
        )
        assert sentinels.master_port_now() == sentinels.replica_port
        new_master = sentinels.client(sentinels.replica_port)
        assert new_master.execute_command("ROLE")[0] == b"master"

        events = cluster.events("pool.log")
        assert named(events, "redis_master_changed")  # the workers and the pool followed
        assert not named(events, "slot_crashed")
        assert not named(events, "slot_exited")  # the same workers carried on, none restarted
        runs = Counter(e["job_id"] for e in named(events, "synthesis_finished"))
        outcomes = client.wait_many(every, timeout=10)
        for job_id in every:
            attempt = outcomes[job_id].attempt  # type: ignore[union-attr]
            assert 1 <= runs[job_id] <= attempt, (job_id, runs[job_id], attempt)
        pids_before = {outcomes[j].worker_pid for j in before}  # type: ignore[union-attr]
        pids_after = {outcomes[j].worker_pid for j in after}  # type: ignore[union-attr]
        assert pids_after <= pids_before  # the processes that ran before the failover

        pool.send_signal(signal.SIGTERM)
        assert pool.wait(timeout=30) == 0
    finally:
        cluster.stop_all()
        client.close()
        connection.close()
