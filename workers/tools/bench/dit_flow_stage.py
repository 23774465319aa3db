"""`cosyq-worker bench flow --family cosyvoice3`: CosyVoice 3's DiT flow at FULL size.

Random weights (`random_dit_flow`), one non-streaming `inference` per run (pre-look-ahead
layer and 10 Euler steps of the batch-of-2 DiT), plus its floor: the FLOPs of one pass
(counted with `FlopCounterMode`) over the GEMM rate measured on this machine in the same run.
Prints the CPU model and ISA flags; `--json` for scripts. Compare ratios from one run: the
machine is shared and noisy.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from workers.engine.cpu_features import host_cpu
from workers.model.dit.model import CausalMaskedDiffWithDiT
from workers.tools.bench.floors import count_flops, gemm_gflops
from workers.tools.bench.flow_stage import _inputs


@dataclass(frozen=True)
class DiTFlowBench:
    """Timed passes and the floor of one FULL DiT flow on one input size."""

    cpu: str
    threads: int
    tokens: int
    prompt_tokens: int
    mel_frames: int
    total_s: tuple[float, ...]
    gflop: float
    gemm_gflops: float

    @property
    def floor_s(self) -> float:
        return self.gflop / self.gemm_gflops


@torch.inference_mode()
def bench_dit_flow(
    flow: CausalMaskedDiffWithDiT,
    *,
    tokens: int,
    prompt_tokens: int,
    threads: int,
    runs: int,
) -> DiTFlowBench:
    """Warm-up, FLOPs count, GEMM rate, then `runs` timed passes (threads restored after)."""
    inputs = _inputs(flow, tokens, prompt_tokens, seed=0)  # type: ignore[arg-type]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        mel, _ = flow.inference(*inputs)  # warm-up
        flops = count_flops(lambda: flow.inference(*inputs))
        rate = gemm_gflops(torch.float32)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            flow.inference(*inputs)
            times.append(time.perf_counter() - start)
    finally:
        torch.set_num_threads(previous)
    frames = mel.size(-1) + inputs[2].size(1)
    return DiTFlowBench(
        host_cpu().line(), threads, tokens, prompt_tokens, frames, tuple(times), flops / 1e9, rate
    )


def format_dit_table(result: DiTFlowBench) -> str:
    """The table: mean and best seconds per pass beside the FLOPs floor."""
    return "\n".join(
        [
            result.cpu,
            f"CosyVoice 3 flow (DiT), FULL size, random weights, fp32, cpu, {result.threads} "
            f"threads, {result.tokens} tokens + {result.prompt_tokens} prompt tokens = "
            f"{result.mel_frames} mel frames, {len(result.total_s)} timed runs",
            f"  {'flow total (pre-look-ahead + 10 Euler steps)':<46}"
            f"  mean {statistics.fmean(result.total_s):.3f} s  best {min(result.total_s):.3f} s",
            f"  {'floor: FLOPs / measured GEMM rate':<46}  {result.floor_s:.3f} s "
            f"({result.gflop:.1f} GFLOP / {result.gemm_gflops:.1f} GFLOP/s)",
        ]
    )


def dit_json(result: DiTFlowBench) -> str:
    doc = asdict(result) | {"floor_s": result.floor_s}
    return json.dumps(doc, indent=2)
