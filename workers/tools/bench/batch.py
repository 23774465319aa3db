"""`cosyq-worker bench batch`: throughput of the engine's batch session per batch size.

Per batch size B, B seeded requests (each piece forced to `tokens` speech tokens) are
submitted at once to a fresh `open_batch_session(B)`; the row reports jobs, audio seconds,
wall seconds, throughput (audio s per wall s), speed-up against B=1, p50/p95 job latency
(submit to result), each stage's seconds per job (a job's share of every batched call) and
the peak RSS sampled while the row ran. Before the rows, one plain `engine.run` (what
`cosyq-worker bench` times) gives the lone-job figure the B=1 row is held to. Every row is
measured in one process and one run, so the ratios compare like with like on a noisy host.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import soundfile
import torch

from workers.engine.api import SynthesisInput, SynthesisOutput, VoicePrompt
from workers.engine.pipeline import EngineOptions, SynthesisPipeline, build_engine
from workers.engine.requests import STAGES
from workers.tools.bench.engine_bench import BenchOptions, forced_tokens, model_directory
from workers.tools.bench.report import _rows

JSON_KEYS = (
    "batch_size",
    "jobs",
    "audio_s",
    "wall_s",
    "throughput",
    "p50_latency_s",
    "p95_latency_s",
    "peak_rss_gb",
)


@dataclass(frozen=True)
class BatchRow:
    batch_size: int
    jobs: int
    audio_s: float
    wall_s: float
    latencies: tuple[float, ...]
    stages: dict[str, float]  # mean seconds per job
    peak_rss_gb: float
    shared: int  # the most jobs that shared an LLM step

    @property
    def throughput(self) -> float:
        return self.audio_s / self.wall_s if self.wall_s > 0 else 0.0

    def json_row(self) -> dict[str, float | int]:
        return {
            "batch_size": self.batch_size,
            "jobs": self.jobs,
            "audio_s": round(self.audio_s, 4),
            "wall_s": round(self.wall_s, 4),
            "throughput": round(self.throughput, 4),
            "p50_latency_s": round(float(np.percentile(self.latencies, 50)), 4),
            "p95_latency_s": round(float(np.percentile(self.latencies, 95)), 4),
            "peak_rss_gb": round(self.peak_rss_gb, 3),
        }


@dataclass(frozen=True)
class BatchBench:
    model: str
    device: str
    dtype: str
    tokens: int | None
    plain_wall_s: float
    plain_audio_s: float
    rows: tuple[BatchRow, ...]
    load_average: tuple[float, float]
    omp_wait_policy: str = "(unset)"
    flow: str = "exact"  # COSYQ_BATCH_FLOW's choice the rows ran with
    family: str = "cosyvoice2"  # the benched directory's, from its yaml
    llm_precision: str = "native"  # COSYQ_LLM_PRECISION's choice the rows ran with

    @property
    def plain_throughput(self) -> float:
        return self.plain_audio_s / self.plain_wall_s if self.plain_wall_s > 0 else 0.0


class RssSampler:
    """The process's resident set, sampled every `interval_s` on a thread; `peak` since start."""

    def __init__(self, interval_s: float = 0.02) -> None:
        self.interval_s = interval_s
        self.peak = 0
        self._process = psutil.Process()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> RssSampler:
        self.peak = self._process.memory_info().rss
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak = max(self.peak, self._process.memory_info().rss)


def run_batch_size(
    engine: SynthesisPipeline, voice: VoicePrompt, text: str, batch_size: int, seed: int
) -> BatchRow:
    """B requests submitted at once to a fresh session; timed from the first submit."""
    requests = [SynthesisInput(text=text, prompt=voice, seed=seed + i) for i in range(batch_size)]
    done: list[float] = [0.0] * batch_size
    with RssSampler() as rss:
        session = engine.open_batch_session(batch_size)
        start = time.perf_counter()
        futures = [session.submit(r) for r in requests]
        for index, future in enumerate(futures):
            future.add_done_callback(_stamp(done, index))
        outputs: list[SynthesisOutput] = [f.result() for f in futures]
        wall = time.perf_counter() - start
        session.close()
    audio = sum(o.samples.shape[0] / o.sample_rate for o in outputs)
    stages = {s: statistics.fmean(o.stage_seconds.get(s, 0.0) for o in outputs) for s in STAGES}
    return BatchRow(
        batch_size=batch_size,
        jobs=batch_size,
        audio_s=audio,
        wall_s=wall,
        latencies=tuple(t - start for t in done),
        stages=stages,
        peak_rss_gb=rss.peak / 1e9,
        shared=max(o.batch_size for o in outputs),
    )


def _stamp(done: list[float], index: int) -> Callable[[Future[SynthesisOutput]], None]:
    def stamp(_future: Future[SynthesisOutput]) -> None:
        done[index] = time.perf_counter()

    return stamp


def run(options: BenchOptions, batch_sizes: Sequence[int], *, flow: str = "exact") -> BatchBench:
    """`flow`: as `COSYQ_BATCH_FLOW` (exact: below fp32 each piece's flow runs alone)."""
    torch.set_num_threads(options.threads)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="cosyq-bench-batch-") as workdir:
        root = model_directory(options, Path(workdir))
        temporary = options.model_dir is None and options.config == "tiny"
        tokens = forced_tokens(options)
        engine = build_engine(
            root,
            device=options.device,
            dtype=options.dtype,
            options=EngineOptions(
                forced_speech_tokens=tokens,
                max_batch=max(*batch_sizes, 1),
                join_reduced_precision_flow=flow == "joined",
                llm_precision=options.llm_precision,
                ort_cache_dir=options.cache_dir / "onnx",
            ),
            hash_cache_dir=Path(workdir) / "hashes" if temporary else options.hash_cache_dir,
        )
        samples, rate = soundfile.read(root / "prompt.wav", dtype="float32")
        voice = engine.extract_voice(samples, int(rate), (root / "prompt.txt").read_text())
        engine.warm_up()
        request = SynthesisInput(text=options.text, prompt=voice, seed=options.seed)
        start = time.perf_counter()
        plain, _ = engine.run(request)
        plain_wall = time.perf_counter() - start
        rows = tuple(
            run_batch_size(engine, voice, options.text, b, options.seed) for b in batch_sizes
        )
    return BatchBench(
        model=engine.identity.name,
        device=engine.identity.device,
        dtype=options.dtype,
        tokens=tokens,
        plain_wall_s=plain_wall,
        plain_audio_s=plain.shape[0] / engine.sample_rate,
        rows=rows,
        load_average=(load_before, os.getloadavg()[0]),
        omp_wait_policy=options.omp_wait_policy,
        flow=flow,
        family=engine.family,
        llm_precision=options.llm_precision,
    )


def format_json(result: BatchBench) -> str:
    """The rows, and the plain `engine.run` they are held to (`b1_over_plain`: the B=1 row's
    throughput over it, null without a B=1 row)."""
    base = next((r.throughput for r in result.rows if r.batch_size == 1), None)
    plain = result.plain_throughput
    return json.dumps(
        {
            "model": result.model,
            "family": result.family,
            "device": result.device,
            "dtype": result.dtype,
            "flow": result.flow,
            "llm_precision": result.llm_precision,
            "tokens": result.tokens,
            "plain_wall_s": round(result.plain_wall_s, 4),
            "plain_audio_s": round(result.plain_audio_s, 4),
            "plain_throughput": round(plain, 4),
            "b1_over_plain": round(base / plain, 4) if base and plain else None,
            "load_average": [round(x, 2) for x in result.load_average],
            "omp_wait_policy": result.omp_wait_policy,
            "rows": [row.json_row() for row in result.rows],
        }
    )


def format_table(result: BatchBench) -> str:
    base = next((r.throughput for r in result.rows if r.batch_size == 1), None)
    header: tuple[str, ...] = (
        "B",
        "jobs",
        "audio s",
        "wall s",
        "audio s/s",
        "speed-up",
        "p50 s",
        "p95 s",
    )
    header += (*(f"{s} s/job" for s in STAGES), "shared", "peak RSS GB")
    lines: list[tuple[str, ...]] = [header]
    for row in result.rows:
        figures = row.json_row()
        lines.append(
            (
                str(row.batch_size),
                str(row.jobs),
                f"{row.audio_s:.2f}",
                f"{row.wall_s:.2f}",
                f"{row.throughput:.3f}",
                f"{row.throughput / base:.2f}x" if base else "-",
                f"{figures['p50_latency_s']:.2f}",
                f"{figures['p95_latency_s']:.2f}",
                *(f"{row.stages[s]:.3f}" for s in STAGES),
                str(row.shared),
                f"{row.peak_rss_gb:.2f}",
            )
        )
    plain = result.plain_throughput
    lone = f"B=1 / plain: {base / plain:.3f}" if base and plain else "B=1 / plain: (no B=1 row)"
    return "\n".join(
        [
            f"cosyq-worker bench batch: {result.model} ({result.family}) on {result.device}, "
            f"{result.dtype}, "
            f"{result.tokens or 'unforced'} tokens per piece, batch flow {result.flow}, "
            f"LLM {result.llm_precision}",
            *_rows(lines),
            f"plain engine.run (what `cosyq-worker bench` times): {result.plain_wall_s:.2f} s "
            f"for {result.plain_audio_s:.2f} s of audio = {plain:.3f} audio s/s; {lone}",
            f"load average (1 min) before/after: {result.load_average[0]:.2f} / "
            f"{result.load_average[1]:.2f}; OMP_WAIT_POLICY={result.omp_wait_policy}",
        ]
    )
