"""COSYQ_REDIS_WAIT_REPLICAS not met after a worker claimed a job (workers/service/
housekeeping.py, NotReplicatedError), on real processes: the Redis here has no replica, so
every claim's WAIT times out and the job is given back, never run. Each give-back must take the
job off the worker's heartbeat list at once (it kept refreshing the job's heartbeat key, and
showed it as its current job, until the worker ended: a job given back and then run by
another worker that died was never reaped). Asserted, whatever the timing: the job never
runs, is in its queue at most once, ends canceled by a cancel, and then the worker holds no
heartbeat for it and shows no current job."""

from __future__ import annotations

import pytest
import redis

from producer import CosyqClient
from shared import keys
from tests.doubles.harness import Cluster, client_settings, enqueue, named, wait_for

SETTLE_S = 30.0  # a bound for what a heartbeat interval or two bring, never a guess at a race


def worker_stats(connection: redis.Redis) -> list[dict[bytes, bytes]]:
    return [connection.hgetall(key) for key in connection.keys(keys.WORKER_STATS_PREFIX + "*")]


def test_a_job_whose_claim_is_not_replicated_is_given_back_and_off_the_heartbeat_list(
    cluster: Cluster, connection: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = enqueue(connection, "seconds:1 never replicated")
    worker = cluster.start(
        "run",
        log_name="w.log",
        COSYQ_REDIS_WAIT_REPLICAS="1",
        COSYQ_REDIS_WAIT_TIMEOUT_S="0.05",
    )
    wait_for(lambda: named(cluster.events("w.log"), "job_not_started"), SETTLE_S, "a claim refused")
    queue = f"rq:queue:{job.origin}"
    assert connection.lrange(queue, 0, -1).count(job.id.encode()) <= 1
    with CosyqClient(client_settings(cluster, monkeypatch)) as client:
        assert client.cancel(job.id).verdict in ("canceled", "stopping")
    wait_for(lambda: job.get_status(refresh=True) == "canceled", SETTLE_S, "the job canceled")
    # a tick that shows no current job refreshed no heartbeat after it: from then on only the
    # key's TTL can keep it (the old code refreshed it, and showed the job, until it ended)
    wait_for(
        lambda: [s.get(b"current_job") for s in worker_stats(connection)] == [b""],
        SETTLE_S,
        "the worker showing no current job",
    )
    heartbeat = keys.job_heartbeat_key(job.id)
    wait_for(lambda: not connection.exists(heartbeat), SETTLE_S, "no heartbeat for the job")
    assert connection.lrange(queue, 0, -1) == []
    assert worker.poll() is None  # it went on
    assert not named(cluster.events("w.log"), "synthesis_finished")  # never run
