"""`cosyq-worker bench flow --family cosyvoice3`: CosyVoice 3's DiT flow at FULL size.

Random weights (`random_dit_flow`), one non-streaming `inference` per run (pre-look-ahead
layer and 10 Euler steps of the batch-of-2 DiT), plus its floor: the FLOPs of one pass
(counted with `FlopCounterMode`) over the GEMM rate measured on this machine in the same run,
in the pass's dtype. With `--dtype bf16` one model goes through three rows in one run: fp32
(the reference mel), bf16 on plain PyTorch ops (no packing, fusion or blocked attention: what
the loader gave the DiT before it got the CPU kernels), and bf16 as the loader builds it now
(`kernel_policy.apply_stage_policy`); each bf16 row with its mel SNR against fp32, the last
with its time by op group (`floors.op_shares`). Prints the CPU model and ISA flags; `--json`
for scripts. Compare ratios from one run: the machine is shared and noisy.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import Tensor

from workers.engine.cpu_features import host_cpu
from workers.model.dit.model import CausalMaskedDiffWithDiT
from workers.model.kernel_policy import apply_stage_policy, kernel_policy
from workers.tools.bench.floors import OpShares, count_flops, gemm_gflops, op_shares
from workers.tools.bench.flow_stage import _inputs
from workers.tools.bench.precision import snr_db

PLAIN_POLICY_DEVICE = torch.device("meta")  # a non-CPU device's policy: plain PyTorch modules


@dataclass(frozen=True)
class DiTFlowRow:
    """Timed passes of one build of the flow, beside its floor in its dtype."""

    label: str
    total_s: tuple[float, ...]
    gflop: float
    gemm_gflops: float
    snr_db: float | None  # mel against the fp32 row's; None for fp32 itself
    ops: OpShares | None

    @property
    def floor_s(self) -> float:
        return self.gflop / self.gemm_gflops

    @property
    def x_floor(self) -> float:
        return min(self.total_s) / self.floor_s


@dataclass(frozen=True)
class DiTFlowBench:
    """The rows of one FULL DiT flow on one input size."""

    cpu: str
    threads: int
    tokens: int
    prompt_tokens: int
    mel_frames: int
    rows: tuple[DiTFlowRow, ...]


@torch.inference_mode()
def bench_dit_flow(
    flow: CausalMaskedDiffWithDiT,
    *,
    tokens: int,
    prompt_tokens: int,
    threads: int,
    runs: int,
    dtype: torch.dtype = torch.float32,
) -> DiTFlowBench:
    """`runs` timed passes of fp32 `flow`; below fp32, then of `flow` converted in place
    (plain ops, then the CPU kernels). Threads are restored after."""
    inputs = _inputs(flow, tokens, prompt_tokens, seed=0)  # type: ignore[arg-type]
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        reference, fp32 = _row(flow, inputs, "fp32", torch.float32, runs, None)
        rows = [fp32]
        if dtype != torch.float32:
            name = str(dtype).removeprefix("torch.").replace("bfloat16", "bf16")
            flow.to(dtype)
            apply_stage_policy(flow, kernel_policy(PLAIN_POLICY_DEVICE, dtype), rows_alone=True)
            rows.append(_row(flow, inputs, f"{name}, plain ops", dtype, runs, reference)[1])
            apply_stage_policy(flow, kernel_policy(torch.device("cpu"), dtype), rows_alone=True)
            rows.append(_row(flow, inputs, f"{name}, CPU kernels", dtype, runs, reference)[1])
    finally:
        torch.set_num_threads(previous)
    frames = reference.size(-1) + inputs[2].size(1)
    cpu = host_cpu().line()
    return DiTFlowBench(cpu, threads, tokens, prompt_tokens, frames, tuple(rows))


def _row(  # noqa: PLR0917 - one call per row
    flow: CausalMaskedDiffWithDiT,
    inputs: tuple[Tensor, ...],
    label: str,
    dtype: torch.dtype,
    runs: int,
    reference: Tensor | None,
) -> tuple[Tensor, DiTFlowRow]:
    """Warm-up (its mel), FLOPs, the GEMM rate in `dtype`, then `runs` timed passes."""
    step: Callable[[], tuple[Tensor, object]] = lambda: flow.inference(*inputs)  # noqa: E731
    mel = step()[0]
    flops = count_flops(step)
    rate = gemm_gflops(dtype)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    snr = None if reference is None else snr_db(reference.numpy(), mel.float().numpy())
    ops = op_shares(step) if reference is not None and "kernels" in label else None
    return mel, DiTFlowRow(label, tuple(times), flops / 1e9, rate, snr, ops)


def format_dit_table(result: DiTFlowBench) -> str:
    """One line per row: mean and best seconds per pass, floor, best over floor, SNR."""
    lines = [
        result.cpu,
        f"CosyVoice 3 flow (DiT), FULL size, random weights, cpu, {result.threads} threads, "
        f"{result.tokens} tokens + {result.prompt_tokens} prompt tokens = {result.mel_frames} "
        f"mel frames, {len(result.rows[0].total_s)} timed runs; flow total = pre-look-ahead + "
        "10 Euler steps; floor = FLOPs / measured GEMM rate in the row's dtype",
        f"  {'build':<20}  {'mean s':>8}  {'best s':>8}  {'floor s':>8}  {'x floor':>7}  "
        f"{'GFLOP':>7}  {'GFLOP/s':>7}  {'mel SNR dB':>10}",
    ]
    for row in result.rows:
        snr = "-" if row.snr_db is None else f"{row.snr_db:.1f}"
        lines.append(
            f"  {row.label:<20}  {statistics.fmean(row.total_s):8.3f}  {min(row.total_s):8.3f}  "
            f"{row.floor_s:8.3f}  {row.x_floor:7.2f}  {row.gflop:7.1f}  {row.gemm_gflops:7.1f}  "
            f"{snr:>10}"
        )
        if row.ops is not None:
            ops = row.ops
            lines.append(
                f"    {row.label}, one profiled pass ({ops.wall_s:.3f} s): products "
                f"{ops.matmul:.0%}, attention {ops.attention:.0%}, other ops {ops.other_ops:.0%}"
                f", between ops {ops.outside_ops:.0%}"
            )
    return "\n".join(lines)


def dit_json(result: DiTFlowBench) -> str:
    doc = asdict(result)
    for row, out in zip(result.rows, doc["rows"], strict=True):
        out |= {"floor_s": row.floor_s, "x_floor": row.x_floor}
    return json.dumps(doc, indent=2)
