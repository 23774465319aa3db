"""A pool of workers fed from a real Redis: jobs/s, audio s per wall s, p50/p95 latency, GPU
memory per worker, and the first chunk of streamed jobs sent at once.

Runs as its own process (`python -m workers.tools.gpu_check.pool ... --json`), so the pool's
workers (each its own process, loading the model on the device) are all that touches the GPU.
`gpu_engine` is the workers' `COSYQ_ENGINE`: the product's engine on the configured device and
dtype, every piece forced to `BENCH_FORCED_TOKENS` speech tokens (random weights never stop).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from workers.tools.bench.document import bench_client, start_pool, stop_pool
from workers.tools.local_redis import LocalRedis

FORCED_TOKENS_VAR = "BENCH_FORCED_TOKENS"
TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away."
WAIT_S = 600.0
KEPT_SETTINGS = (  # the GPU knobs a run may try (the caller's environment reaches the pool)
    "COSYQ_COMPILE_DECODE",
    "COSYQ_COMPILE_CACHE_DIR",
    "COSYQ_CUDA_GRAPHS",
    "COSYQ_BATCH_MAX_POSITIONS",
)


def gpu_engine(settings: Any) -> Any:
    """The real engine on the settings' model, device and dtype; pieces forced to N tokens."""
    from workers.engine.pipeline import build_engine  # noqa: PLC0415 (torch only here)
    from workers.service.default_engine import dtype_for, engine_options  # noqa: PLC0415

    forced = int(os.environ.get(FORCED_TOKENS_VAR, "100"))
    options = dataclasses.replace(engine_options(settings), forced_speech_tokens=forced)
    dtype = dtype_for(settings, settings.device)
    return build_engine(settings.model_dir, device=settings.device, dtype=dtype, options=options)


def pool_env(redis_url: str, args: argparse.Namespace, out: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYQ_") or k in KEPT_SETTINGS}
    env.update(
        COSYQ_REDIS_URL=redis_url,
        COSYQ_ENGINE="workers.tools.gpu_check.pool:gpu_engine",
        COSYQ_MODEL_DIR=str(args.model_dir),
        COSYQ_DEVICE=args.device,
        COSYQ_DTYPE=args.dtype,
        COSYQ_BATCH_SIZE=str(args.batch_size),
        COSYQ_STORAGE_URL=out.as_uri(),
        COSYQ_LOG_FORMAT="json",
        COSYQ_MAX_JOBS="100000",
        COSYQ_MAX_JOBS_JITTER="0",
        PYTHONUNBUFFERED="1",
    )
    env[FORCED_TOKENS_VAR] = str(args.tokens)
    return env


def gpu_memory_mib() -> dict[int, float]:
    """pid -> MiB each process holds on the GPU (nvidia-smi); empty without one."""
    if shutil.which("nvidia-smi") is None:
        return {}
    query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
    try:
        done = subprocess.run(query, check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    memory = {}
    for line in done.stdout.strip().splitlines():
        pid, used = (part.strip() for part in line.split(","))
        if pid.isdigit():
            memory[int(pid)] = float(used)
    return memory


def percentile(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def batch_run(client: Any, jobs: int) -> dict[str, Any]:
    """`jobs` plain requests at once: throughput and client-observed latency."""
    arrivals: dict[str, float] = {}
    started = time.perf_counter()
    ids = client.submit_many([{"text": TEXT, "seed": i} for i in range(jobs)])

    def arrived(job_id: str, _outcome: Any) -> None:
        arrivals.setdefault(job_id, time.perf_counter() - started)

    outcomes = client.wait_many(ids, timeout=WAIT_S, on_outcome=arrived)
    wall = time.perf_counter() - started
    audio = [float(getattr(o, "duration_s", 0.0)) for o in outcomes.values()]
    done = sum(hasattr(o, "duration_s") for o in outcomes.values())
    latencies = list(arrivals.values())
    return {
        "jobs": jobs,
        "finished": done,
        "wall_s": wall,
        "audio_s": sum(audio),
        "jobs_per_s": done / wall,
        "audio_s_per_wall_s": sum(audio) / wall,
        "p50_latency_s": percentile(latencies, 50),
        "p95_latency_s": percentile(latencies, 95),
        "batch_sizes": sorted({int(getattr(o, "batch_size", 1)) for o in outcomes.values()}),
    }


def stream_run(client: Any, streams: int) -> dict[str, Any]:
    """`streams` streamed requests at once: each one's first chunk from submission."""
    started = time.perf_counter()
    ids = client.submit_many(
        [{"text": TEXT, "seed": 100 + i, "stream": True} for i in range(streams)]
    )
    firsts: list[float] = []
    lock = threading.Lock()

    def read(job_id: str) -> None:
        for _chunk in client.stream(job_id, timeout=WAIT_S):
            with lock:
                firsts.append(time.perf_counter() - started)
            break

    threads = [threading.Thread(target=read, args=(job_id,)) for job_id in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client.wait_many(ids, timeout=WAIT_S)
    return {
        "streams": streams,
        "first_chunk_s": sorted(firsts),
        "first_chunk_p50_s": percentile(firsts, 50),
        "first_chunk_max_s": max(firsts) if firsts else None,
    }


def recycle_ready(env: dict[str, str], work: Path, starts: int) -> list[float]:
    """Seconds from a fresh `cosyq-worker run --burst` process's start to its batch session
    open (model on the device, warm-up, decode graphs captured; `worker_ready` without
    batching), `starts` times in turn: the later ones read the compile cache the first wrote."""
    marker = '"batch_session_opened"' if int(env["COSYQ_BATCH_SIZE"]) > 1 else '"worker_ready"'
    seconds = []
    for index in range(starts):
        log_path = work / f"start-{index}.log"
        started = time.perf_counter()
        with log_path.open("wb") as file:
            process = subprocess.Popen(
                [sys.executable, "-m", "workers.cli", "run", "--burst"],
                env=env,
                stdout=file,
                stderr=subprocess.STDOUT,
            )
        ready = None
        while ready is None and time.perf_counter() - started < WAIT_S:
            if marker in log_path.read_text(errors="replace"):
                ready = time.perf_counter() - started
            elif process.poll() is not None:
                break
            time.sleep(0.05)
        process.wait(timeout=WAIT_S)
        if ready is None:
            raise RuntimeError(f"no {marker} from a fresh worker: see {log_path}")
        seconds.append(ready)
    return seconds


def run_pool(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cosyq-gpu-pool-") as tmp:
        work = Path(tmp)
        with LocalRedis(work / "redis") as redis:
            env = pool_env(redis.url, args, work / "out")
            pool = start_pool(env, args.workers, work / "pool.log")
            try:
                memory = gpu_memory_mib()
                with bench_client(env) as client:
                    batch_run(client, min(args.jobs, args.workers))  # warm-up: every worker once
                    result = batch_run(client, args.jobs)
                    streamed = stream_run(client, args.streams) if args.streams else None
            finally:
                stop_pool(pool)
            ready = recycle_ready(env, work, args.starts) if args.starts else []
    return {
        "workers": args.workers,
        "batch_size": args.batch_size,
        "device": args.device,
        "dtype": args.dtype,
        "tokens": args.tokens,
        **result,
        "gpu_memory_mib_per_worker": sorted(memory.values()),
        "stream": streamed,
        "recycle_ready_s": ready,  # in turn: the first may compile, the later read its cache
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.tools.gpu_check.pool")
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--jobs", type=int, default=128)
    parser.add_argument("--streams", type=int, default=8, help="streamed jobs at once (0: none)")
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--starts", type=int, default=2, help="fresh workers timed (0: none)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run_pool(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
