"""`cosyq-worker bench stream`: the streaming path's latency, chunking and playback, in one run.

In process, on one loaded engine (a long-lived worker's situation): one non-streaming run,
then `jobs` streamed runs of the same request. For each streamed run: time to the first chunk
from the job's start, the last chunk, every chunk's size, its flow and HiFT seconds and the
flow's seconds per second of the chunk's audio (with the flow cache they do not grow with the
chunk's position; `--compare-recompute` adds one run without it) and whether playback
started at the first chunk would ever stall. Then, unless skipped, the same through the real
queue: a private redis-server, one `cosyq-worker run` process, a producer submitting
`stream: true` and reading with `CosyqClient.stream`: first chunk from submit, and
`timings.first_chunk_s` from job start; then (`backlog_jobs` > 0) one streamed job sent to a
`COSYQ_BATCH_SIZE=8` worker already decoding a backlog of non-streamed jobs (`queue.backlog`).
That worker first gets one streamed job of the voice while idle (`queue.backlog_primer`), so
the measured one finds the voice's flow prefix kept, as the idle worker's last job does: the
ratio compares waiting, not a voice's first-job cost.
The machine's load average is printed beside the figures: compare ratios within one run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workers.engine.api import SynthesisInput
from workers.engine.pipeline import build_engine
from workers.engine.requests import RequestState
from workers.tools.bench.engine_bench import BenchOptions, bench_engine_and_request, forced_tokens

FORCED_ENV = "BENCH_STREAM_FORCED_TOKENS"  # read by `forced_engine` in the bench's worker
FULL_RANDOM_STREAM_TOKENS = 250  # 10 s of audio: what upstream's figure was measured on
BACKLOG_BATCH_SIZE = 8  # the batching worker of `queue.backlog` (README's backlog setting)


@dataclass
class ChunkFigures:
    arrival_s: float  # since the run started
    samples: int
    flow_s: float  # flow and HiFT seconds spent since the previous chunk
    hift_s: float


@dataclass
class StreamRun:
    chunks: list[ChunkFigures] = field(default_factory=list)
    total_s: float = 0.0
    sample_rate: int = 24000

    @property
    def first_chunk_s(self) -> float:
        return self.chunks[0].arrival_s if self.chunks else self.total_s

    @property
    def last_chunk_s(self) -> float:
        return self.chunks[-1].arrival_s if self.chunks else self.total_s

    def stalls(self) -> list[float]:
        """Seconds playback would wait before each chunk, playing from the first arrival."""
        waits, play_end = [], None
        for chunk in self.chunks:
            start = chunk.arrival_s if play_end is None else max(chunk.arrival_s, play_end)
            waits.append(0.0 if play_end is None else start - play_end)
            play_end = start + chunk.samples / self.sample_rate
        return waits


@dataclass
class QueueFigures:
    first_from_submit_s: float
    first_from_start_s: float | None
    last_from_submit_s: float
    chunks: int
    queue_wait_s: float
    # the job's model seconds per stage (its result's timings): with first_from_start_s they
    # say whether a slower first chunk waited or computed more slowly
    stage_s: dict[str, float] = field(default_factory=dict)


@dataclass
class QueueRuns:
    """Streamed jobs of the same voice sent one after another through one real worker: the
    first pays what a voice's first job pays, the later ones show the steady state."""

    jobs: list[QueueFigures]
    backlog: QueueFigures | None = None  # one streamed job to a batching worker with a backlog
    backlog_jobs: int = 0  # the non-streamed jobs queued before it
    backlog_primer: QueueFigures | None = None  # the batching worker's first (idle) job


@dataclass
class StreamBench:
    model: str
    tokens: int | None
    nonstream_s: float
    runs: list[StreamRun]
    load_average: tuple[float, float]
    queue: QueueRuns | None = None
    recompute: StreamRun | None = None  # one run re-running the flow over the prefix per hop
    align_prompt: bool = False  # COSYQ_STREAM_ALIGN_PROMPT in process and in the workers


def forced_engine(settings: Any) -> Any:
    """COSYQ_ENGINE for the bench's worker: the product engine, every piece forced to
    BENCH_STREAM_FORCED_TOKENS speech tokens (random weights never stop on their own)."""
    from workers.service.default_engine import dtype_for, engine_options  # noqa: PLC0415

    forced = int(os.environ[FORCED_ENV]) if os.environ.get(FORCED_ENV) else None
    options = dataclasses.replace(engine_options(settings), forced_speech_tokens=forced)
    return build_engine(
        settings.model_dir,
        device="cpu",
        dtype=dtype_for(settings, "cpu"),
        options=options,
        hash_cache_dir=settings.hash_cache_dir,
    )


def _streamed(engine: Any, request: SynthesisInput) -> StreamRun:
    run = StreamRun(sample_rate=engine.sample_rate)
    state = RequestState.start(request.seed)
    seen = {"flow": 0.0, "hift": 0.0}
    start = time.perf_counter()

    def on_chunk(samples: np.ndarray) -> None:
        now = time.perf_counter() - start
        clock = state.clock.seconds
        run.chunks.append(
            ChunkFigures(
                now, int(samples.size), clock["flow"] - seen["flow"], clock["hift"] - seen["hift"]
            )
        )
        seen.update(flow=clock["flow"], hift=clock["hift"])

    engine.run_streaming(request, on_chunk, state=state)
    run.total_s = time.perf_counter() - start
    return run


def run(
    options: BenchOptions,
    *,
    jobs: int,
    through_queue: bool,
    compare_recompute: bool = False,
    queue_jobs: int = 2,
    backlog_jobs: int = 8,
    align_prompt: bool = False,
) -> StreamBench:
    torch.set_num_threads(options.threads)
    load_before = os.getloadavg()[0]
    tokens = options.tokens
    if tokens is None and options.config == "full-random" and options.model_dir is None:
        tokens = FULL_RANDOM_STREAM_TOKENS
    options = BenchOptions(**{**options.__dict__, "tokens": tokens})
    with tempfile.TemporaryDirectory(prefix="cosyq-bench-stream-") as workdir:
        root, engine, request = bench_engine_and_request(options, Path(workdir))
        if align_prompt:
            stream = dataclasses.replace(engine.options.stream, align_prompt=True)
            engine.options = dataclasses.replace(engine.options, stream=stream)
        engine.warm_up()
        start = time.perf_counter()
        engine.run(request)
        nonstream_s = time.perf_counter() - start
        runs = [_streamed(engine, request) for _ in range(jobs)]
        recompute = _recomputed(engine, request) if compare_recompute else None
        del engine
        queue = (
            _through_queue(root, options, Path(workdir), queue_jobs, backlog_jobs, align_prompt)
            if through_queue
            else None
        )
    return StreamBench(
        model=root.name,
        tokens=forced_tokens(options),
        nonstream_s=nonstream_s,
        runs=runs,
        load_average=(load_before, os.getloadavg()[0]),
        queue=queue,
        recompute=recompute,
        align_prompt=align_prompt,
    )


def _recomputed(engine: Any, request: SynthesisInput) -> StreamRun:
    """One streamed run whose flow re-runs every hop over the whole prefix (upstream's way,
    no flow cache): the per-chunk flow seconds it grows by, beside the cached runs'."""
    engine.flow.stream_cache = False
    try:
        return _streamed(engine, request)
    finally:
        engine.flow.stream_cache = True


def _through_queue(  # noqa: PLR0917 - run()'s values, passed on
    root: Path,
    options: BenchOptions,
    workdir: Path,
    jobs: int,
    backlog_jobs: int,
    align_prompt: bool,
) -> QueueRuns:
    """`jobs` streamed jobs, one after another, through a real redis-server and one real
    `cosyq-worker run`; then one streamed job to a fresh batching worker with a backlog."""
    import redis  # noqa: PLC0415

    from producer.client import CosyqClient  # noqa: PLC0415
    from shared.settings import load_settings  # noqa: PLC0415
    from workers.tools.bench.queue import worker_env  # noqa: PLC0415
    from workers.tools.local_redis import LocalRedis  # noqa: PLC0415

    with LocalRedis(workdir / "redis") as server:
        env = worker_env(server.url, f"{__name__}:forced_engine", root, workdir / "out", 5)
        env.update(
            COSYQ_HASH_CACHE_DIR=str(workdir / "hashes"),
            COSYQ_DTYPE=options.dtype,
            OMP_NUM_THREADS=str(options.threads),
        )
        if options.tokens is not None:
            env[FORCED_ENV] = str(options.tokens)
        env["COSYQ_STREAM_ALIGN_PROMPT"] = "true" if align_prompt else "false"
        settings = load_settings(env_file=None).model_copy(
            update={"redis_url": server.url, "storage_url": (workdir / "out").as_uri()}
        )
        with CosyqClient(settings, connection=redis.Redis.from_url(server.url)) as client:
            with _worker(env, workdir / "worker.log", client, stop=True):
                figures = [_queue_job(client, options) for _ in range(jobs)]
            backlog = primer = None
            if backlog_jobs > 0:
                batching = {**env, "COSYQ_BATCH_SIZE": str(BACKLOG_BATCH_SIZE)}
                with _worker(batching, workdir / "batching.log", client, stop=False):
                    primer = _queue_job(client, options)  # the voice's first job there
                    backlog = _behind_a_backlog(client, options, backlog_jobs)
    return QueueRuns(
        jobs=figures, backlog=backlog, backlog_jobs=backlog_jobs, backlog_primer=primer
    )


@contextlib.contextmanager
def _worker(env: dict[str, str], log_path: Path, client: Any, *, stop: bool) -> Iterator[None]:
    """One `cosyq-worker run` until the block ends: stopped (SIGTERM, its job finished) or,
    with `stop` False, killed (a backlog it was decoding is of no more use)."""
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "run"], env=env, stdout=log, stderr=log
        )
        try:
            _wait_ready(client, worker, log_path)
            yield
        finally:
            if stop:
                worker.terminate()
            else:
                worker.kill()
            worker.wait(timeout=60)


def _behind_a_backlog(client: Any, options: BenchOptions, backlog_jobs: int) -> QueueFigures:
    """`backlog_jobs` non-streamed jobs first; once the worker's window runs, one streamed."""
    backlog = [
        client.submit({"text": options.text, "seed": options.seed + 1 + i})
        for i in range(backlog_jobs)
    ]
    deadline = time.monotonic() + 3600
    while not any(client.status(job).state == "started" for job in backlog):
        if time.monotonic() > deadline:
            raise RuntimeError("the batching worker never started its backlog")
        time.sleep(0.2)
    return _queue_job(client, options)


def _queue_job(client: Any, options: BenchOptions) -> QueueFigures:
    """One streamed job (the default voice) submitted and read to its end."""
    submitted = time.perf_counter()
    job = client.submit({"text": options.text, "seed": options.seed, "stream": True})
    arrivals = [time.perf_counter() - submitted for _ in client.stream(job, timeout=3600)]
    result = client.result(job, timeout=600)
    return QueueFigures(
        first_from_submit_s=arrivals[0],
        first_from_start_s=result.timings.first_chunk_s,
        last_from_submit_s=arrivals[-1],
        chunks=len(arrivals),
        queue_wait_s=result.timings.queue_wait_s,
        stage_s={
            stage: getattr(result.timings, f"{stage}_s")
            for stage in ("frontend", "llm", "flow", "hift", "total")
        },
    )


def _wait_ready(client: Any, worker: subprocess.Popen[bytes], log: Path) -> None:
    """Until this worker process says it is ready (its model loaded and warmed up)."""
    deadline = time.monotonic() + 3600
    while '"worker_ready"' not in log.read_text(encoding="utf-8", errors="replace"):
        if worker.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(encoding="utf-8", errors="replace")[-2000:]
            raise RuntimeError(f"the bench's worker did not start:\n{tail}")
        time.sleep(0.5)
