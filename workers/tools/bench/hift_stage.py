"""Time the FULL-size HiFT vocoder with random weights (issue 4 target: 200 frames <= 0.45 s).

`python -m workers.tools.bench.hift_stage [--frames 200] [--runs 5] [--threads 2]` prints a table;
the lead's `bench` command calls `bench_hift()` and formats the rows itself.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from workers.model.hift import HiFTGenerator
from workers.model.hift_config import HiFTConfig
from workers.model.hift_layers import fold_weight_norm
from workers.tools.reference.configs import hift_config_from_reference
from workers.tools.reference.parity import ReferenceSet

UPSTREAM_SECONDS_200_FRAMES = 0.47  # upstream HiFT, full size, fp32, 2 threads (issue 4)
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


def random_full_hift(config: HiFTConfig, *, seed: int = 0) -> HiFTGenerator:
    """FULL architecture on cpu with cheap random weights, weight norm folded, eval mode."""
    torch.manual_seed(seed)
    model = HiFTGenerator(config)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.02)
    fold_weight_norm(model)
    return model.eval()


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reference", type=Path, default=DEFAULT_REFERENCE_DIR)
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    config = hift_config_from_reference(ReferenceSet(args.reference).config, "full")
    result = bench_hift(config, frames=args.frames, runs=args.runs, threads=args.threads)
    print(format_table(result))


if __name__ == "__main__":
    main()
