"""`COSYQ_DTYPE=auto`: the fastest precision this host runs well, and the reason for it.

- MPS and CUDA: fp16 (their half-precision units; HiFT's source and STFT stay fp32 anyway).
- CPU with AMX or AVX512-BF16 (oneDNN's native bf16 dot products): bf16, if a quick measured
  check holds: a bf16 GEMM at least `MIN_SPEEDUP` times faster than fp32's through the same
  linear the model uses. A CPU that lists the flags but runs bf16 slowly stays fp32.
- Any other CPU (AVX2 only, arm64 without a measured win): fp32. Without native bf16, torch
  emulates it and runs several times slower (measured on an AVX2-only EPYC: docs/benchmarks.md).
The default setting stays fp32: it is what the reference parity and every measured table hold,
and `auto` is the opt-in for hosts where the measurement says otherwise.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from workers.engine.cpu_features import HostCPU, host_cpu
from workers.model.cpu_linear import linear

MIN_SPEEDUP = 1.2  # bf16 must beat fp32 by this much on the check's GEMM to be chosen
CHECK_SIZE = 512  # (512 x 512) @ (512 x 512): ~0.3 GFLOP per product, ~50 ms for the check
CHECK_REPEATS = 3


@dataclass(frozen=True)
class DtypeChoice:
    name: str  # "fp32" | "fp16" | "bf16"
    reason: str


def _gemm_seconds(dtype: torch.dtype) -> float:
    x = torch.randn(CHECK_SIZE, CHECK_SIZE).to(dtype)
    w = torch.randn(CHECK_SIZE, CHECK_SIZE).to(dtype)
    linear(x, w)  # warm: oneDNN primitive creation
    best = float("inf")
    for _ in range(CHECK_REPEATS):
        start = time.perf_counter()
        linear(x, w)
        best = min(best, time.perf_counter() - start)
    return best


def measured_bf16_speedup() -> float:
    """fp32 seconds over bf16 seconds for the check's GEMM (best of a few each)."""
    return _gemm_seconds(torch.float32) / _gemm_seconds(torch.bfloat16)


def choose_dtype(
    device: torch.device, host: HostCPU | None = None, speedup: float | None = None
) -> DtypeChoice:
    """The precision `auto` means on `device` (`host` and `speedup` injectable for tests)."""
    if device.type in ("mps", "cuda"):
        return DtypeChoice("fp16", f"{device.type}: half precision runs on the GPU's fp16 units")
    host = host or host_cpu()
    if not host.has_bf16_matmul:
        return DtypeChoice(
            "fp32", f"{host.model}: no AMX or AVX512-BF16, bf16 would be emulated (slower)"
        )
    speedup = measured_bf16_speedup() if speedup is None else speedup
    if speedup < MIN_SPEEDUP:
        return DtypeChoice(
            "fp32",
            f"{host.model}: has native bf16 but a bf16 GEMM measured only {speedup:.2f}x "
            f"fp32's (< {MIN_SPEEDUP:g}x)",
        )
    return DtypeChoice(
        "bf16", f"{host.model}: native bf16, a bf16 GEMM measured {speedup:.2f}x fp32's"
    )


def resolve_dtype_setting(name: str, device: torch.device) -> DtypeChoice:
    """A `COSYQ_DTYPE` value -> the precision to load; an explicit one is kept as asked."""
    if name == "auto":
        return choose_dtype(device)
    return DtypeChoice(name, f"COSYQ_DTYPE={name} (set explicitly)")
