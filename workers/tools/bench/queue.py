"""`cosyq-worker bench queue`: what the queue costs per job, next to bare RQ, and a recycle.

On a private redis-server (never the operator's), it measures:
- our worker (`cosyq-worker run --burst`, the configured engine) on N synthesize jobs, with
  the given model directory or else the tiny model, written to the temporary folder;
- a stock `rq worker -w rq.worker.SimpleWorker` on N no-op jobs;
and prints jobs/s, per-job wall time, synthesis time and overhead (wall - synthesis) for both,
their overhead ratio (goal: ours within 2x bare RQ's), and the recycle cost: process start to
`worker_ready`. Timings come from RQ's own job timestamps and each result's stage timings.
Audio goes to a temporary folder under $TMPDIR with the storage's usual fsync per file, so the
encode+store column depends on that disk (TMPDIR=/dev/shm isolates the queue's own cost).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from statistics import mean
from typing import Any

import redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from workers.tools.local_redis import LocalRedis

BENCH_QUEUE = "cosyq-bench"
BENCH_TEXT = "The quick brown fox jumps over the lazy dog."
LOG_TAIL_CHARS = 3000  # of a failed run's log, shown in the error
RUN_TIMEOUT_S = 600.0  # one measured run (N jobs) may take at most this long


def noop() -> None:
    """The bare-RQ baseline's job: nothing at all."""


@dataclass(frozen=True)
class RunStats:
    """One measured burst run."""

    label: str
    jobs: int
    span_s: float  # first job started -> last job ended (RQ's timestamps)
    synthesis_s: float  # mean per job, from the results' model stages (0 for no-op)
    encode_store_s: float  # mean per job, encoding + storage writes (part of the overhead)
    batch_size: float = 1.0  # mean of the results' batch_size (jobs sharing a model step)
    model_busy_s: float = 0.0  # time the model had work (COSYQ_BATCH_SIZE > 1: from the log)

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.span_s if self.span_s > 0 else 0.0

    @property
    def wall_ms(self) -> float:
        return 1000 * self.span_s / self.jobs

    @property
    def model_ms(self) -> float:
        """Model time per job: the log's busy time when batching (jobs overlap), else the
        results' stage times."""
        busy = self.model_busy_s or self.jobs * self.synthesis_s
        return 1000 * busy / self.jobs

    @property
    def overhead_ms(self) -> float:
        return self.wall_ms - self.model_ms

    @property
    def model_idle_share(self) -> float:
        """Share of the span in which the model had nothing to do."""
        busy = self.jobs * self.model_ms / 1000
        return max(0.0, 1 - busy / self.span_s) if self.span_s > 0 else 0.0


@dataclass(frozen=True)
class RecycleStats:
    start_to_ready_s: list[float]
    load_s: list[float]
    warm_up_s: list[float]
    imports_s: list[float]  # the quality measures' imports before ready (0 when turned off)


def tiny_model_dir(folder: Path) -> Path:
    """The tiny model (official layout, prompt.wav/prompt.txt included), as `bench` uses."""
    from workers.tools.fixtures.tiny import write_tiny_model  # noqa: PLC0415 (torch)

    write_tiny_model(folder)
    return folder


def worker_env(
    redis_url: str, engine: str, model_dir: Path, out_dir: Path, jobs: int, *, batch_size: int = 1
) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        COSYQ_REDIS_URL=redis_url,
        COSYQ_ENGINE=engine,
        COSYQ_MODEL_DIR=str(model_dir),
        COSYQ_STORAGE_URL=out_dir.as_uri(),
        COSYQ_MAX_JOBS=str(jobs + 10),  # no recycling inside a measured run
        COSYQ_MAX_JOBS_JITTER="0",
        COSYQ_BATCH_SIZE=str(batch_size),
        COSYQ_LOG_FORMAT="json",
        COSYQ_LOG_LEVEL="INFO",  # worker_ready is read back from the log
        PYTHONUNBUFFERED="1",
    )
    return env


def enqueue_many(
    connection: redis.Redis, func: str, kwargs: dict[str, object], n: int
) -> list[str]:
    queue = Queue(BENCH_QUEUE, connection=connection, serializer=JSONSerializer)
    datas = [Queue.prepare_data(func, kwargs=kwargs, result_ttl=3600) for _ in range(n)]
    return [job.id for job in queue.enqueue_many(datas)]


def run_burst(command: Sequence[str], env: dict[str, str], log_path: Path) -> None:
    with log_path.open("wb") as log:
        done = subprocess.run(
            command,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0:
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL_CHARS:]
        raise RuntimeError(f"{' '.join(command[:4])}... exited {done.returncode}:\n{tail}")


def measure(
    connection: redis.Redis, job_ids: list[str], label: str, log_path: Path | None = None
) -> RunStats:
    jobs = [job for job in Job.fetch_many(job_ids, connection, JSONSerializer) if job]
    unfinished = [job.id for job in jobs if job.get_status(refresh=False) != "finished"]
    if unfinished or len(jobs) != len(job_ids):
        raise RuntimeError(f"{label}: {len(unfinished)} of {len(job_ids)} jobs did not finish")
    starts = [job.started_at for job in jobs if job.started_at]
    ends = [job.ended_at for job in jobs if job.ended_at]
    span = (max(ends) - min(starts)).total_seconds()
    timings = [_timings(job) for job in jobs]
    synthesis = mean(_sum(t, "frontend_s", "llm_s", "flow_s", "hift_s") for t in timings)
    encode_store = mean(_sum(t, "encode_s", "store_s") for t in timings)
    sizes = [_batch_size(job) for job in jobs]
    busy = sum(float(e["model_busy_s"]) for e in _events(log_path, "batch_window_closed"))
    return RunStats(label, len(jobs), span, synthesis, encode_store, mean(sizes), busy)


def _batch_size(job: Job) -> int:
    result = job.return_value()
    return int(result.get("batch_size", 1)) if isinstance(result, dict) else 1


def _timings(job: Job) -> dict[str, float]:
    result = job.return_value()
    timings = result.get("timings", {}) if isinstance(result, dict) else {}
    return {k: float(v) for k, v in timings.items() if v is not None}  # first_chunk_s may be None


def _sum(timings: dict[str, float], *names: str) -> float:
    return sum(timings.get(name, 0.0) for name in names)


def recycle_cost(env: dict[str, str], workdir: Path, repeats: int) -> RecycleStats:
    """Start an idle burst worker `repeats` times: process start -> worker_ready."""
    totals, loads, warms, imports = [], [], [], []
    for attempt in range(repeats):
        log_path = workdir / f"recycle-{attempt}.log"
        started = time.time()
        command = [sys.executable, "-m", "workers.cli", "run", "--burst", BENCH_QUEUE]
        run_burst(command, env, log_path)
        ready = first_event(log_path, "worker_ready")
        totals.append(datetime.fromisoformat(str(ready["timestamp"])).timestamp() - started)
        loads.append(float(ready["load_s"]))
        warms.append(float(ready["warm_up_s"]))
        imports.append(float(ready.get("imports_s", 0.0)))
    return RecycleStats(totals, loads, warms, imports)


def first_event(log_path: Path, name: str) -> dict[str, Any]:
    for event in _events(log_path, name):
        return event
    raise RuntimeError(f"no {name} in {log_path}")


def _events(log_path: Path | None, name: str) -> Iterator[dict[str, Any]]:
    if log_path is None:
        return
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("event") == name:
                yield dict(event)


def run(
    engine: str, model_dir: Path | None, jobs: int, repeats: int, batch_size: int = 1
) -> tuple[RunStats, RunStats, RecycleStats]:
    """The whole benchmark; returns (ours, bare RQ, recycle)."""
    with tempfile.TemporaryDirectory(prefix="cosyq-bench-") as temp:
        workdir = Path(temp)
        with LocalRedis(workdir / "redis") as server:
            url = server.url
            connection = redis.Redis.from_url(url)
            if model_dir is None:
                model_dir = tiny_model_dir(workdir / "model")
            out_dir = workdir / "out"
            env = worker_env(url, engine, model_dir, out_dir, jobs, batch_size=batch_size)
            ours_ids = enqueue_many(
                connection, "workers.tasks.synthesize", {"request": {"text": BENCH_TEXT}}, jobs
            )
            run_burst(
                [sys.executable, "-m", "workers.cli", "run", "--burst", BENCH_QUEUE],
                env,
                workdir / "cosyq.log",
            )
            label = "cosyq worker" if batch_size == 1 else f"cosyq worker, batch {batch_size}"
            ours = measure(connection, ours_ids, label, workdir / "cosyq.log")
            bare_ids = enqueue_many(connection, f"{__name__}.noop", {}, jobs)
            rq_command = [
                sys.executable,
                "-m",
                "rq.cli",
                "worker",
                "--burst",
                "-w",
                "rq.worker.SimpleWorker",
                "-S",
                "rq.serializers.JSONSerializer",
                "--url",
                url,
                BENCH_QUEUE,
            ]
            run_burst(rq_command, env, workdir / "rq.log")
            bare = measure(connection, bare_ids, "bare rq SimpleWorker")
            recycle = recycle_cost(env, workdir, repeats)
    return ours, bare, recycle


def _ratio(ours: float, bare: float) -> float:
    return ours / bare if bare > 0 else float("inf")


def format_table(engine: str, ours: RunStats, bare: RunStats, recycle: RecycleStats) -> str:
    rows = [
        f"queue benchmark: {ours.jobs} jobs per run, private redis-server, engine {engine}, "
        f"audio under {tempfile.gettempdir()}",
        f"{'':30} {'jobs/s':>7} {'wall ms/job':>12} {'model ms/job':>13} {'overhead ms':>12}"
        f" {'(encode+store ms)':>18} {'batch':>6} {'model idle':>10}",
    ]
    for stats in (ours, bare):
        rows.append(
            f"{stats.label:30} {stats.jobs_per_s:7.1f} {stats.wall_ms:12.2f} "
            f"{stats.model_ms:13.2f} {stats.overhead_ms:12.2f}"
            f" {1000 * stats.encode_store_s:18.2f} {stats.batch_size:6.2f}"
            f" {stats.model_idle_share:10.1%}"
        )
    ratio = _ratio(ours.overhead_ms, bare.overhead_ms)
    queue_only = _ratio(ours.overhead_ms - 1000 * ours.encode_store_s, bare.overhead_ms)
    rows.append(
        f"overhead ratio cosyq / bare rq: {ratio:.2f} (goal <= 2.00); "
        f"without encode+store: {queue_only:.2f}"
    )
    rows.append(
        f"recycle cost, process start -> worker_ready (n={len(recycle.start_to_ready_s)}): "
        f"{mean(recycle.start_to_ready_s):.2f} s (load {mean(recycle.load_s):.2f} s, "
        f"warm-up {mean(recycle.warm_up_s):.2f} s)"
    )
    return "\n".join(rows)
