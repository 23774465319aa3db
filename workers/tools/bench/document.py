"""`cosyq-worker bench document`: one long document on 1 and 2 worker processes, its overhead
against the same segments as plain jobs, and the assembly's peak memory for an hour of audio.

On a private redis-server with the tiny model (every piece forced to `--forced-tokens` speech
tokens so the random LLM stops), it measures:
- wall time, submit -> assembled, of one document on a fresh pool of 1 and of 2 workers;
- right after each, the same segments (same texts, seeds and format) submitted as plain jobs
  to a fresh pool of the same size: the document's per-segment overhead is (document wall -
  plain wall) / segments, and its share of the plain wall (target within 5%);
- the assembly alone, in a fresh process, of synthetic documents of `--assembly-minutes`
  (default 10 and 60) of stored segments: peak RSS (the child's own VmHWM on Linux), which
  should not grow with the length (one segment in memory at a time).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import redis
import soundfile as sf

from shared.document_state import (
    DocumentPlanRecord,
    SegmentDone,
    SegmentPlan,
    document_key,
    save_plan,
)
from shared.settings import load_settings
from workers.engine.cpu_features import host_cpu
from workers.tools.bench.queue import tiny_model_dir
from workers.tools.local_redis import LocalRedis

BENCH_WORDS = [
    "morning",
    "river",
    "lantern",
    "quiet",
    "garden",
    "window",
    "letter",
    "harbor",
    "candle",
    "bridge",
]
READY_TIMEOUT_S = 600.0
ASSEMBLY_SEGMENT_S = 60.0  # synthetic segments of the assembly run: a minute each
FORCED_TOKENS_VAR = "BENCH_FORCED_TOKENS"  # not a COSYQ_ setting: the bench engine's own
OVERHEAD_TARGET = 0.05  # issue 23: a document within 5% of its segments as plain jobs
RSS_TARGET_MB = 200.0  # issue 23: the assembly of a one-hour document under 200 MB


def forced_engine(settings: Any) -> Any:
    """The real engine on the settings' model, every piece forced to BENCH_FORCED_TOKENS."""
    import dataclasses  # noqa: PLC0415

    from workers.engine.pipeline import build_engine  # noqa: PLC0415 (torch only here)
    from workers.service.default_engine import engine_options  # noqa: PLC0415

    forced = int(os.environ.get(FORCED_TOKENS_VAR, "8"))
    options = dataclasses.replace(engine_options(settings), forced_speech_tokens=forced)
    return build_engine(settings.model_dir, device="cpu", options=options)


def bench_text(chars: int) -> str:
    sentences: list[str] = []
    i = 0
    while sum(len(s) + 1 for s in sentences) < chars:
        words = [BENCH_WORDS[(i * 3 + k) % len(BENCH_WORDS)] for k in range(7 + i % 4)]
        sentences.append(" ".join(words).capitalize() + ".")
        i += 1
    return "\n\n".join(" ".join(sentences[j : j + 8]) for j in range(0, len(sentences), 8))


def bench_env(redis_url: str, model_dir: Path, out: Path, forced: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COSYQ_")}
    env.update(
        COSYQ_REDIS_URL=redis_url,
        COSYQ_ENGINE="workers.tools.bench.document:forced_engine",
        COSYQ_MODEL_DIR=str(model_dir),
        COSYQ_DEVICE="cpu",
        COSYQ_STORAGE_URL=out.as_uri(),
        COSYQ_LOG_FORMAT="json",
        COSYQ_MAX_JOBS_JITTER="0",
        COSYQ_DOCUMENT_SEGMENT_CHARS="400",  # the tiny tokenizer: ~0.7 tokens per character
        PYTHONUNBUFFERED="1",
    )
    env[FORCED_TOKENS_VAR] = str(forced)
    return env


def start_pool(env: dict[str, str], workers: int, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as file:
        process = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "pool", "-n", str(workers)],
            env=env,
            stdout=file,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while log.read_text(errors="replace").count('"worker_ready"') < workers:
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"the pool did not get {workers} workers ready: see {log}")
        time.sleep(0.2)
    return process


def stop_pool(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def bench_client(env: dict[str, str]) -> Any:
    from producer.client import CosyqClient  # noqa: PLC0415

    overrides = {k[len("COSYQ_") :].lower(): v for k, v in env.items() if k.startswith("COSYQ_")}
    return CosyqClient(load_settings(env_file=None, **overrides))


def document_run(env: dict[str, str], text: str, workers: int, log: Path) -> dict[str, Any]:
    """One document on a pool of `workers`: wall seconds, segments, audio seconds."""
    pool = start_pool(env, workers, log)
    try:
        with bench_client(env) as client:
            started = time.perf_counter()
            document_id = client.submit_document({"text": text, "seed": 1})
            result = client.document_result(document_id, timeout=READY_TIMEOUT_S * 4)
            wall = time.perf_counter() - started
            plan = client.connection.get(document_key(document_id))
    finally:
        stop_pool(pool)
    record = DocumentPlanRecord.model_validate_json(plan)
    return {
        "workers": workers,
        "wall_s": wall,
        "segments": result.segments,
        "audio_s": result.duration_s,
        "plan": record,
    }


def plain_run(env: dict[str, str], plan: DocumentPlanRecord, workers: int, log: Path) -> float:
    """The document's segments as plain jobs on `workers`: wall seconds until all are done."""
    pool = start_pool(env, workers, log)
    try:
        with bench_client(env) as client:
            requests = [{**plan.job, "text": s.text, "seed": s.seed} for s in plan.segments]
            started = time.perf_counter()
            ids = client.submit_many(requests)
            client.wait_many(ids, timeout=READY_TIMEOUT_S * 4)
            return time.perf_counter() - started
    finally:
        stop_pool(pool)


def assembly_segments(minutes: float) -> int:
    return max(1, round(minutes * 60 / ASSEMBLY_SEGMENT_S))


def synthetic_document(
    connection: redis.Redis, out: Path, minutes: float, sample_rate: int = 24000
) -> str:
    """A plan and `minutes` of stored segments (a minute each), as if every job had run."""
    document_id = uuid.uuid4().hex
    count = assembly_segments(minutes)
    tone = (0.2 * np.sin(np.arange(int(ASSEMBLY_SEGMENT_S * sample_rate)) * 0.05)).astype(
        np.float32
    )
    segments, done = [], {}
    for index in range(count):
        key = f"documents/{document_id}/segments/{index:05d}.wav"
        path = out / key
        path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, tone, sample_rate, subtype="FLOAT")
        segments.append(SegmentPlan(index=index, text="x", plain=f"segment {index}",
                                    pause_before_s=0.6, seed=index, key=key))  # fmt: skip
        done[str(index)] = SegmentDone(job_id=f"j{index}", uri=path.as_uri(), duration_s=60.0)
    plan = DocumentPlanRecord(document_id=document_id, created_at=datetime.now(UTC).isoformat(),
                              seed=0, job={}, format="mp3", sample_format="pcm16",
                              sample_rate=sample_rate, output_key=f"documents/{document_id}/doc",
                              priority="default", segments=segments)  # fmt: skip
    pipe = connection.pipeline()
    save_plan(pipe, plan, [f"j{i}" for i in range(count)], 3600)
    pipe.hset(
        f"cosyq:document:{document_id}:done",
        mapping={k: v.model_dump_json() for k, v in done.items()},
    )
    pipe.execute()
    return document_id


# The peak is the child's own VmHWM (/proc/self/status) where there is one: on Linux,
# ru_maxrss survives exec, so it reported the spawning bench process's RSS whenever that was
# the larger (160 MB, 420 MB with the tiny model loaded: the earlier figures were the bench's).
ASSEMBLE_CODE = """
import json, resource, sys
from pathlib import Path
from redis import Redis
from shared.settings import load_settings
from shared.storage import open_storage
from workers.documents.job import assemble
settings = load_settings(env_file=None)
connection = Redis.from_url(settings.redis_url)
result = assemble(connection, open_storage(settings), settings, sys.argv[1], "bench")
status = Path("/proc/self/status")
lines = status.read_text().splitlines() if status.exists() else []
hwm = [int(line.split()[1]) for line in lines if line.startswith("VmHWM:")]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
peak_mb = hwm[0] / 1024 if hwm else peak / 1024 / (1024 if sys.platform == "darwin" else 1)
print(json.dumps({"duration_s": result.duration_s, "bytes": result.bytes,
                  "peak_rss_mb": peak_mb, "peak_source": "VmHWM" if hwm else "ru_maxrss"}))
"""


def assembly_run(env: dict[str, str], document_id: str) -> dict[str, Any]:
    """The assembly alone, in a fresh process (no model loaded): its peak RSS."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", ASSEMBLE_CODE, document_id],
        env={**env, "COSYQ_DOCUMENT_KEEP_SEGMENTS": "true"},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the assembly failed: {done.stderr[-2000:]}")

    return {
        **json.loads(done.stdout.strip().splitlines()[-1]),
        "wall_s": time.perf_counter() - started,
    }


def run_document_bench(
    chars: int, forced: int, minutes: list[float], *, synthesis: bool = True
) -> dict[str, Any]:
    """The report; `synthesis` False: the assembly figures only (no model, seconds to run)."""
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cosyq-bench-document-") as folder:
        root = Path(folder)
        server = LocalRedis(root / "redis")
        server.start()
        try:
            model_dir = tiny_model_dir(root / "model") if synthesis else root / "model"
            env = bench_env(server.url, model_dir, root / "out", forced)
            report = _synthesis_report(env, bench_text(chars), root) if synthesis else {}
            connection = redis.Redis.from_url(server.url)
            assemblies = []
            for length in minutes:
                document_id = synthetic_document(connection, root / "out", length)
                assemblies.append(
                    {
                        "minutes": length,
                        "segments": assembly_segments(length),
                        **assembly_run(env, document_id),
                    }
                )
        finally:
            server.stop()
    return {
        "cpu": host_cpu().as_json(),
        "load_average_before": list(load_before),
        "load_average": list(os.getloadavg()),
        "targets": {"overhead_share": OVERHEAD_TARGET, "assembly_peak_rss_mb": RSS_TARGET_MB},
        **report,
        "assembly": assemblies,
        "this_process_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _synthesis_report(env: dict[str, str], text: str, root: Path) -> dict[str, Any]:
    """Per pool size (1, then 2): one document, then its segments as plain jobs.

    Every run starts on a fresh, warmed-up pool, and each pair runs back to back, so the
    overhead compares runs under the same load."""
    rows = []
    for workers in (1, 2):
        run = document_run(env, text, workers, root / f"document-{workers}.log")
        plain = plain_run(env, run.pop("plan"), workers, root / f"plain-{workers}.log")
        overhead = run["wall_s"] - plain
        rows.append(
            {
                **run,
                "plain_wall_s": plain,
                "overhead_per_segment_s": overhead / run["segments"],
                "overhead_share": overhead / plain if plain > 0 else 0.0,
            }
        )
    return {
        "document_chars": len(text),
        "documents": rows,
        "speed_up_2_over_1": rows[0]["wall_s"] / rows[1]["wall_s"] if rows[1]["wall_s"] else 0.0,
    }
