"""`cosyq-worker bench soak`: N varied jobs through a recycling pool; nothing may be lost.

On a private redis-server with the tiny model (written to a temporary folder, as the demo does)
it starts `cosyq-worker pool`, registers a voice, submits the mix of workers/tools/bench/
soak_jobs.py (the bad ones straight through RQ where the producer would refuse them), and
waits until every job has ended. It records finished, failed (must be exactly the bad ones)
and lost (must be 0), the pool's recycles, each worker process's RSS after its first and
last job (sampled from the pool's own /metrics, `cosyq_worker_rss_bytes`), and throughput.
"""

from __future__ import annotations

import os
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from producer import CosyqClient
from shared import keys
from shared.settings import load_settings
from workers.tools.bench.soak_jobs import SOAK_VOICE, SoakJob, soak_jobs
from workers.tools.bench.soak_report import (
    ProcessMemory,
    SoakOptions,
    SoakReport,
    pool_events,
    scrape_rss,
)
from workers.tools.local_redis import LocalRedis, free_port
from workers.tools.pool_process import pool_process

POLL_S = 1.0  # status poll and RSS sample period
FETCH_CHUNK = 500
RECYCLE_REASONS = frozenset({"max_jobs", "rss", "lifetime", "job_timeout"})
TERMINAL = frozenset({"finished", "failed"})


def run_soak(options: SoakOptions) -> SoakReport:
    load_before = os.getloadavg()[0]
    with (
        tempfile.TemporaryDirectory(prefix="cosyq-soak-") as temp,
        LocalRedis(Path(temp) / "redis") as server,
    ):
        workdir = Path(temp)
        from workers.tools.fixtures.tiny import write_tiny_model  # noqa: PLC0415 (torch)

        model_dir = write_tiny_model(workdir / "model").root.resolve()
        port = free_port()
        env = _pool_env(server.url, model_dir, workdir / "out", options.max_jobs, port)
        settings = load_settings(
            env_file=None,
            redis_url=server.url,
            storage_url=env["COSYQ_STORAGE_URL"],
            model_dir=model_dir,
        )
        connection = redis.Redis.from_url(server.url)
        with (
            pool_process(env, options.pool, workdir / "pool.log") as pool_log,
            CosyqClient(settings) as client,
        ):
            audio = (model_dir / "prompt.wav").read_bytes()
            transcript = (model_dir / "prompt.txt").read_text(encoding="utf-8").strip()
            client.wait_for_voice(client.add_voice(SOAK_VOICE, audio, transcript), timeout=600)
            planned = soak_jobs(options.jobs, options.bad_every, model_dir, options.seed)
            started = time.monotonic()
            ids = _submit(client, connection, planned)
            memory: dict[int, ProcessMemory] = {}
            statuses = _wait(connection, ids, port, memory, options.stall_s)
            wall_s = time.monotonic() - started
            report = _report(options, connection, planned, ids, statuses, memory, wall_s)
        report.recycles, report.crashes = _exits(pool_log)
    report.load_average = (load_before, os.getloadavg()[0])
    return report


def _pool_env(
    redis_url: str, model_dir: Path, out_dir: Path, max_jobs: int, metrics_port: int
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYQ_")}
    env.update(
        COSYQ_REDIS_URL=redis_url,
        COSYQ_MODEL_DIR=str(model_dir),
        COSYQ_STORAGE_URL=out_dir.resolve().as_uri(),
        COSYQ_MAX_JOBS=str(max_jobs),
        COSYQ_METRICS_PORT=str(metrics_port),
        COSYQ_LOG_FORMAT="json",
        COSYQ_LOG_LEVEL="INFO",
        PYTHONUNBUFFERED="1",
    )
    # Even a pool of one shares the cores with Redis and this process: threads that spin
    # while waiting starve them (the pool sets this itself only for two or more slots).
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


def _submit(client: CosyqClient, connection: redis.Redis, planned: list[SoakJob]) -> list[str]:
    """Producer jobs in one pipelined batch; raw ones through plain RQ, as a foreign client."""
    ids = [""] * len(planned)
    through_producer = [i for i, job in enumerate(planned) if not job.raw]
    for i, job_id in zip(
        through_producer,
        client.submit_many([planned[i].request for i in through_producer]),
        strict=True,
    ):
        ids[i] = job_id
    queue = Queue(keys.QUEUE_DEFAULT, connection=connection, serializer=JSONSerializer)
    for i, job in enumerate(planned):
        if job.raw:
            ids[i] = queue.enqueue(keys.SYNTHESIZE_FUNCTION, request=job.request).id
    return ids


def _wait(
    connection: redis.Redis,
    ids: list[str],
    metrics_port: int,
    memory: dict[int, ProcessMemory],
    stall_s: float,
) -> dict[str, str]:
    """Poll until every job ended or none ended for stall_s; sample RSS meanwhile."""
    statuses: dict[str, str] = {}
    last_progress, done = time.monotonic(), 0
    while True:
        statuses = _statuses(connection, ids)
        _sample_rss(metrics_port, memory)
        ended = sum(status in TERMINAL for status in statuses.values())
        if ended == len(ids):
            return statuses
        if ended > done:
            last_progress, done = time.monotonic(), ended
        elif time.monotonic() - last_progress > stall_s:
            return statuses
        time.sleep(POLL_S)


def _statuses(connection: redis.Redis, ids: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for start in range(0, len(ids), FETCH_CHUNK):
        chunk = ids[start : start + FETCH_CHUNK]
        with connection.pipeline(transaction=False) as pipe:
            for job_id in chunk:
                pipe.hget(Job.key_for(job_id), "status")
            for job_id, status in zip(chunk, pipe.execute(), strict=True):
                out[job_id] = status.decode() if status else "missing"
    return out


def _sample_rss(port: int, memory: dict[int, ProcessMemory]) -> None:
    """One scrape of the pool's /metrics: each live worker's RSS, by pid."""
    now = time.time()
    for pid, rss in scrape_rss(f"http://127.0.0.1:{port}/metrics").items():
        memory.setdefault(pid, ProcessMemory(pid)).samples.append((now, rss))


def _report(  # noqa: PLR0917 - one call site, every input named there
    options: SoakOptions,
    connection: redis.Redis,
    planned: list[SoakJob],
    ids: list[str],
    statuses: dict[str, str],
    memory: dict[int, ProcessMemory],
    wall_s: float,
) -> SoakReport:
    unexpected, audio_s = [], 0.0
    for job_id, job in zip(ids, planned, strict=True):
        status = statuses.get(job_id, "missing")
        if status == "finished":
            finished_job = Job.fetch(job_id, connection, serializer=JSONSerializer)
            result = finished_job.return_value()
            if isinstance(result, dict):
                audio_s += float(result.get("duration_s", 0.0))
                _note_job_end(memory, result.get("worker_pid"), finished_job.ended_at)
            if job.bad:
                unexpected.append(f"{job_id}: bad ({job.bad_kind}) but finished")
        elif status == "failed" and not job.bad:
            unexpected.append(f"{job_id}: failed: {_reason(connection, job_id)}")
    return SoakReport(
        options=options,
        jobs=len(planned),
        bad=sum(job.bad for job in planned),
        finished=sum(s == "finished" for s in statuses.values()),
        failed=sum(s == "failed" for s in statuses.values()),
        lost=sum(s not in TERMINAL for s in statuses.values()),
        recycles=0,
        crashes=0,
        wall_s=wall_s,
        audio_s=audio_s,
        processes=sorted(memory.values(), key=lambda p: min(p.job_ends, default=0.0)),
        unexpected=unexpected,
        load_average=(0.0, 0.0),
    )


def _note_job_end(memory: dict[int, ProcessMemory], pid: object, ended: datetime | None) -> None:
    if isinstance(pid, int) and ended is not None:
        aware = ended if ended.tzinfo is not None else ended.replace(tzinfo=UTC)
        memory.setdefault(pid, ProcessMemory(pid)).job_ends.append(aware.timestamp())


def _reason(connection: redis.Redis, job_id: str) -> str:
    job = Job.fetch(job_id, connection, serializer=JSONSerializer)
    error = job.meta.get(keys.ERROR_META_KEY)
    return str(error.get("message")) if isinstance(error, dict) else "(no reason recorded)"


def _exits(pool_log: Path) -> tuple[int, int]:
    """Recycles (exits for a recycling reason) and crashes, from the pool's log."""
    events = pool_events(pool_log)
    stop = next((e["timestamp"] for e in events if e["event"] == "pool_stopping"), "~")
    recycles = sum(
        1
        for e in events
        if e["event"] == "slot_exited"
        and e.get("reason") in RECYCLE_REASONS
        and e["timestamp"] < stop
    )
    crashes = sum(1 for e in events if e["event"] == "slot_crashed")
    return recycles, crashes
