"""Time the FULL-size HiFT vocoder with random weights (target: 200 frames <= 0.45 s).

`cosyq-worker bench hift [--frames 200] [--runs 5] [--threads 2]` prints its table; the engine
bench calls `bench_hift()` and formats the rows itself.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from workers.model.hift.config import HiFTConfig
from workers.tools.fixtures.random_weights import random_full_hift

UPSTREAM_SECONDS_200_FRAMES = 0.47  # upstream HiFT, full size, fp32, 2 threads, same machine
TARGET_SECONDS_200_FRAMES = 0.45
DEFAULT_REFERENCE_DIR = Path("../shared/cosyvoice2-reference")


@dataclass(frozen=True)
class HiFTBench:
    """Timings of `runs` calls after one warm-up call, in seconds."""

    frames: int
    threads: int
    first_s: float
    runs_s: tuple[float, ...]

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.runs_s)

    @property
    def median_s(self) -> float:
        return statistics.median(self.runs_s)

    @property
    def audio_s(self) -> float:
        return self.frames / 50.0  # 50 mel frames per second


def bench_hift(
    config: HiFTConfig, *, frames: int = 200, runs: int = 5, threads: int = 2, seed: int = 0
) -> HiFTBench:
    """Build the random FULL model and time `inference` on a random mel of `frames` frames."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        model = random_full_hift(config, seed=seed)
        mel = torch.randn(1, config.in_channels, frames, generator=torch.Generator().manual_seed(1))
        generator = torch.Generator().manual_seed(seed)
        times = []
        for _ in range(runs + 1):
            start = time.perf_counter()
            model.inference(mel, generator=generator)
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    return HiFTBench(frames, threads, times[0], tuple(times[1:]))


def format_table(result: HiFTBench) -> str:
    rows = [
        ("frames (audio s)", f"{result.frames} ({result.audio_s:.1f})"),
        ("threads", str(result.threads)),
        ("first call s", f"{result.first_s:.3f}"),
        ("mean s", f"{result.mean_s:.3f}"),
        ("median s", f"{result.median_s:.3f}"),
        ("min s", f"{min(result.runs_s):.3f}"),
        ("RTF (median)", f"{result.median_s / result.audio_s:.3f}"),
        ("upstream s (200 frames)", f"{UPSTREAM_SECONDS_200_FRAMES:.2f}"),
        ("target s (200 frames)", f"{TARGET_SECONDS_200_FRAMES:.2f}"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
