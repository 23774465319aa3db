"""A cancel that lands while a worker starts the job it popped, on purpose, on real processes.

The worker looks at the cancel flag (none), then a DELETE cancels the job and is told
`canceled`: the worker must not start it after all (status canceled -> started, stopped at its
first step). Each worker here is a CosyqWorker subclass from tests/doubles/racy_workers.py
that runs the producer's own cancel at that moment: after the look and before the start's
claim, or inside the claim, between its reads and its MULTI/EXEC (workers/service/cancels.py).
Both with one job at a time and batched (`cluster` runs both). Asserted, whatever the timing:
the cancel is told `canceled`, the job's status (every write Redis applied, read by MONITOR)
is never `started` after `canceled`, it ends canceled, nothing stored, one `job.canceled`.
"""

from __future__ import annotations

import sys

import pytest
import redis

from shared import keys
from tests.doubles.harness import Cluster, enqueue, statuses
from tests.doubles.racy_workers import CANCEL_VERDICT_PREFIX
from tests.doubles.status_history import StatusHistory, started_after_canceled
from tests.integration.service.test_cancel import assert_canceled

HOOK = "https://hooks.example.com/"


def outbox_events(connection: redis.Redis, job_id: str) -> list[str]:
    entries = connection.xrange(keys.WEBHOOK_OUTBOX)
    fields = [{k.decode(): v.decode() for k, v in entry.items()} for _, entry in entries]
    return [event["event"] for event in fields if event["job_id"] == job_id]


@pytest.mark.parametrize("double", ["CanceledBeforeClaim", "CanceledInsideClaim"])
def test_a_job_canceled_as_its_worker_starts_it_never_starts(
    cluster: Cluster, connection: redis.Redis, redis_url: str, double: str
) -> None:
    history = StatusHistory(redis_url)
    job = enqueue(connection, "seconds:1 doomed", webhook={"url": HOOK + "x"})
    kept = enqueue(connection, "seconds:1 kept")
    command = [sys.executable, "-m", "rq.cli", "worker", "--url", redis_url, "--burst"]
    command += ["-w", f"tests.doubles.racy_workers.{double}"]
    command += ["-S", "rq.serializers.JSONSerializer", "cosyq-default"]
    worker = cluster.spawn(command, "w.log", COSYQ_WEBHOOK_ALLOWED_URLS=HOOK)
    assert worker.wait(timeout=90) == 0
    history.stop()
    assert connection.get(CANCEL_VERDICT_PREFIX + job.id) == b"canceled"
    assert not started_after_canceled(history.statuses(job.id)), history.statuses(job.id)
    assert_canceled(connection, cluster, job)
    assert outbox_events(connection, job.id) == ["job.canceled"]
    assert statuses(connection, [kept]) == ["finished"]  # the worker went on
