"""`COSYQ_DTYPE=auto`: the fastest precision this host runs well, and the reason for it.

- MPS: fp16 (its half-precision units; HiFT's source and STFT stay fp32 anyway).
- CUDA: bf16 on cards with native bf16 tensor cores (compute capability 8.0 and up: A100,
  L4/L20/L40, H100/H200), fp16 below that (V100, T4: bf16 would be emulated). On sm80+ both
  run on the same tensor cores at the same rate, and bf16 keeps fp32's exponent range, so the
  LLM's attention logits and the flow's activations cannot overflow as fp16 can (upstream
  guards fp16 with autocast for that reason). The rule is to be confirmed by measurement:
  `scripts/gpu-check` prints each stage's SNR against fp32 and the speed of both.
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

CUDA_BF16_CAPABILITY = (8, 0)  # Ampere: the first NVIDIA tensor cores with bf16
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


def cuda_capability(device: torch.device) -> tuple[int, int]:
    """The card's compute capability (major, minor)."""
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def choose_cuda_dtype(capability: tuple[int, int]) -> DtypeChoice:
    """bf16 from compute capability 8.0 up, else fp16 (see the module docstring)."""
    sm = f"sm{capability[0]}{capability[1]}"
    if capability >= CUDA_BF16_CAPABILITY:
        return DtypeChoice(
            "bf16", f"cuda {sm}: native bf16 tensor cores, fp32's exponent range (no overflow)"
        )
    return DtypeChoice("fp16", f"cuda {sm}: no native bf16 (before sm80), fp16 tensor cores")


def choose_dtype(
    device: torch.device,
    host: HostCPU | None = None,
    speedup: float | None = None,
    *,
    capability: tuple[int, int] | None = None,
) -> DtypeChoice:
    """The precision `auto` means on `device` (`host`, `speedup` and the CUDA `capability`
    injectable for tests)."""
    if device.type == "mps":
        return DtypeChoice("fp16", "mps: half precision runs on the GPU's fp16 units")
    if device.type == "cuda":
        return choose_cuda_dtype(capability or cuda_capability(device))
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
