"""`cosyq-worker bench tenants`: fair share measured through a real worker (tiny model).

Tenant alpha queues `--alpha-jobs` (200) jobs, then tenant beta queues `--beta-jobs` (5); only
then one worker starts (fresh, per batch size). The figure is the order jobs were taken
(`started_at`): beta's last job must be taken within beta-jobs x 2 (tenants) + batch size
jobs, not after alpha's backlog (issue 24). The worker stops once beta's jobs are done.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from rq.job import Job

from workers.engine.cpu_features import host_cpu
from workers.tools.bench.document import bench_client, bench_env, start_pool, stop_pool
from workers.tools.bench.queue import tiny_model_dir
from workers.tools.local_redis import LocalRedis

TENANTS = ("alpha", "beta")
DONE_TIMEOUT_S = 600.0  # beta's jobs on a fresh worker, a loaded machine included


def bound(beta_jobs: int, batch_size: int) -> int:
    """Issue 24: B's jobs are all taken within B x tenants + batch size jobs."""
    return beta_jobs * len(TENANTS) + batch_size


def run_tenants_bench(
    alpha_jobs: int, beta_jobs: int, batch_sizes: list[int], forced: int
) -> dict[str, Any]:
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="cosyq-bench-tenants-") as folder:
        root = Path(folder)
        model_dir = tiny_model_dir(root / "model")
        for batch_size in batch_sizes:
            server = LocalRedis(root / f"redis-{batch_size}")
            server.start()
            try:
                env = bench_env(server.url, model_dir, root / "out", forced) | {
                    "COSYQ_TENANTS": ",".join(TENANTS),
                    "COSYQ_MAX_JOBS": str(alpha_jobs + beta_jobs + 1),  # no recycling midway
                    "COSYQ_BATCH_SIZE": str(batch_size),
                }
                rows.append(_one(env, alpha_jobs, beta_jobs, batch_size, root))
            finally:
                server.stop()
    return {
        "cpu": host_cpu().as_json(),
        "load_average_before": list(load_before),
        "load_average": list(os.getloadavg()),
        "alpha_jobs": alpha_jobs,
        "beta_jobs": beta_jobs,
        "rows": rows,
    }


def _one(
    env: dict[str, str], alpha_jobs: int, beta_jobs: int, batch_size: int, root: Path
) -> dict[str, Any]:
    with bench_client(env) as client:
        alpha, beta = client.for_tenant("alpha"), client.for_tenant("beta")
        alpha_ids = [alpha.submit({"text": f"Alpha job {n}."}) for n in range(alpha_jobs)]
        beta_ids = [beta.submit({"text": f"Beta job {n}."}) for n in range(beta_jobs)]
        start = time.monotonic()
        pool = start_pool(env, 1, root / f"pool-{batch_size}.log")
        try:
            for job_id in beta_ids:
                client.result(job_id, timeout=DONE_TIMEOUT_S)
            beta_done_s = time.monotonic() - start
        finally:
            stop_pool(pool)
        jobs = Job.fetch_many(alpha_ids + beta_ids, connection=client.connection)
    started = sorted(
        (job.started_at, job.id in set(beta_ids)) for job in jobs if job and job.started_at
    )
    beta_positions = [n + 1 for n, (_, is_beta) in enumerate(started) if is_beta]
    limit = bound(beta_jobs, batch_size)
    return {
        "batch_size": batch_size,
        "beta_positions": beta_positions,
        "beta_last_position": max(beta_positions),
        "bound": limit,
        "met": len(beta_positions) == beta_jobs and max(beta_positions) <= limit,
        "alpha_taken_before_beta_done": max(beta_positions) - beta_jobs,
        "beta_done_s": beta_done_s,
    }


def format_table(report: dict[str, Any]) -> str:
    cpu = report["cpu"]
    lines = [
        f"cosyq-worker bench tenants: CPU {cpu.get('model')}; load average "
        f"{report['load_average_before'][0]:.2f} before, {report['load_average'][0]:.2f} after",
        f"alpha queues {report['alpha_jobs']} jobs, then beta {report['beta_jobs']}; one worker",
        "batch  beta taken at (position)       last  bound  beta done s  verdict",
    ]
    for row in report["rows"]:
        positions = ", ".join(str(p) for p in row["beta_positions"])
        lines.append(
            f"{row['batch_size']:>5}  {positions:<28} {row['beta_last_position']:>5}  "
            f"{row['bound']:>5}  {row['beta_done_s']:>11.1f}  {'met' if row['met'] else 'MISSED'}"
        )
    return "\n".join(lines)
