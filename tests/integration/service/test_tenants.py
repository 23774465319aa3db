"""Fair share between tenants, measured on the order jobs were taken (started_at), so it holds
whatever the timing: tenant A queues 200 jobs, then tenant B queues 5; B's 5 are all taken
within the first 5 x 2 (tenants) + batch size jobs, not after A's 200. Runs on the one-job
path (batch1) and the batch pop (batch8) through the cluster fixture. Plus: a job from the
queue naming a tenant the worker does not know, or sitting in another tenant's queue, is refused.
"""

from __future__ import annotations

from datetime import datetime

import redis
from rq.job import Job

from producer import CosyqClient
from shared.settings import load_settings
from shared.tenants import TENANT_META_KEY
from tests.doubles.harness import Cluster, json_queue, statuses

TENANTS = {"COSYQ_TENANTS": "alpha,beta", "COSYQ_MAX_JOBS": "1000"}  # no recycling midway
A_JOBS, B_JOBS = 200, 5


def _started_at(job: Job) -> datetime:
    job.refresh()
    assert job.started_at is not None, job.id
    return job.started_at


def test_a_tenants_backlog_delays_another_by_a_few_jobs_not_the_backlog(
    cluster: Cluster, connection: redis.Redis, redis_url: str, worker_batch_size: int
) -> None:
    settings = load_settings(None, redis_url=redis_url, tenants="alpha,beta", max_retries=0)
    with CosyqClient(settings, tenant="alpha") as alpha:
        a_ids = alpha.submit_many([{"text": f"alpha job {n}"} for n in range(A_JOBS)])
        b_ids = alpha.for_tenant("beta").submit_many(
            [{"text": f"beta job {n}"} for n in range(B_JOBS)]
        )
        assert connection.llen("rq:queue:cosyq-default.alpha") == A_JOBS
        worker = cluster.start("run", "--burst", log_name="w.log", **TENANTS)
        assert worker.wait(timeout=120) == 0
        jobs = [Job.fetch(i, connection=connection) for i in a_ids + b_ids]
        assert set(statuses(connection, jobs)) == {"finished"}
        taken = [job.id for job in sorted(jobs, key=_started_at)]
        positions = sorted(taken.index(job_id) for job_id in b_ids)
        bound = B_JOBS * 2 + worker_batch_size
        assert positions[-1] < bound, positions
        beta = alpha.for_tenant("beta")
        assert {beta.result(i, timeout=0).tenant for i in b_ids} == {"beta"}
        assert alpha.status(a_ids[0]).tenant == "alpha"
        assert alpha.status(b_ids[0]).queue == "cosyq-default.beta"


def test_a_job_naming_an_unknown_or_another_tenant_is_refused(
    cluster: Cluster, connection: redis.Redis, redis_url: str
) -> None:
    ghost = json_queue(connection, "cosyq-default").enqueue(
        "workers.tasks.synthesize", request={"text": "hi"}, meta={TENANT_META_KEY: "ghost"}
    )
    borrowed = json_queue(connection, "cosyq-default.alpha").enqueue(
        "workers.tasks.synthesize", request={"text": "hi"}, meta={TENANT_META_KEY: "beta"}
    )
    own = json_queue(connection, "cosyq-default.alpha").enqueue(
        "workers.tasks.synthesize", request={"text": "hi"}, meta={TENANT_META_KEY: "alpha"}
    )
    worker = cluster.start("run", "--burst", log_name="w.log", **TENANTS)
    assert worker.wait(timeout=60) == 0
    assert statuses(connection, [ghost, borrowed, own]) == ["failed", "failed", "finished"]
    settings = load_settings(None, redis_url=redis_url, tenants="alpha,beta")
    with CosyqClient(settings) as client:
        for job, said in ((ghost, "unknown tenant 'ghost'"), (borrowed, "cosyq-default.alpha")):
            failure = client.status(job.id).failure
            assert failure is not None and failure.kind == "invalid_request"
            assert said in failure.message and "unknown tenant" in failure.message
