"""`COSYQ_DTYPE=auto`: fp16 on MPS, bf16 on CUDA sm80+ (fp16 below), bf16 on a CPU only with
native bf16 and a measured win."""

from __future__ import annotations

import torch

from workers.engine.auto_dtype import MIN_SPEEDUP, choose_dtype, resolve_dtype_setting
from workers.engine.cpu_features import HostCPU

CPU = torch.device("cpu")


def host(*flags: str) -> HostCPU:
    return HostCPU(model="Test CPU", machine="x86_64", flags=flags, cores=2)


def test_mps_gets_fp16() -> None:
    assert choose_dtype(torch.device("mps")).name == "fp16"


def test_cuda_gets_bf16_from_ampere_on_and_fp16_before() -> None:
    cuda = torch.device("cuda")
    h100 = choose_dtype(cuda, capability=(9, 0))
    assert h100.name == "bf16" and "sm90" in h100.reason
    assert choose_dtype(cuda, capability=(8, 0)).name == "bf16"  # A100
    assert choose_dtype(cuda, capability=(8, 9)).name == "bf16"  # L4, L20, L40
    t4 = choose_dtype(cuda, capability=(7, 5))
    assert t4.name == "fp16" and "sm75" in t4.reason
    assert choose_dtype(cuda, capability=(7, 0)).name == "fp16"  # V100


def test_a_cpu_without_native_bf16_stays_fp32_whatever_the_check() -> None:
    choice = choose_dtype(CPU, host("avx2", "fma", "avx512f"), speedup=9.0)
    assert choice.name == "fp32" and "no AMX or AVX512-BF16" in choice.reason


def test_native_bf16_needs_the_measured_speedup() -> None:
    slow = choose_dtype(CPU, host("avx512_bf16"), speedup=MIN_SPEEDUP - 0.01)
    assert slow.name == "fp32" and "measured only" in slow.reason
    fast = choose_dtype(CPU, host("amx_bf16"), speedup=1.9)
    assert fast.name == "bf16" and "1.90x" in fast.reason


def test_an_explicit_setting_is_kept_and_auto_is_resolved_here() -> None:
    assert resolve_dtype_setting("bf16", CPU).name == "bf16"
    assert resolve_dtype_setting("auto", CPU).name in ("fp32", "bf16")
