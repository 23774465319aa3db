"""`COSYQ_FLOW_PRECISION`: the flow estimator's large products at the flow's dtype or in int8.

- `native` (default): PyTorch at the worker's dtype, as before this setting existed.
- `int8`: each transformer block's products through ONNX Runtime's `DynamicQuantizeMatMul`
  (`workers.model.flow.int8_products`), everything else at the worker's dtype. Only on a CPU
  with single-instruction int8 dot products (VNNI: `avx512_vnni`, `avx_vnni` or AMX): without
  them the int8 kernel is no faster than bf16/fp32 (the LLM's int8 step on an AVX2 host ran at
  ~2x its floor for want of them). CosyVoice 2's U-Net only, on the CPU with the torch backend.

Measured (docs/benchmarks.md, "flow int8"): on a Zen 4 (AVX512-VNNI/BF16) the non-streaming
flow of a 300-frame piece took 0.84-0.90x bf16's time, mel 37.9 dB against fp32 (bf16's own
39.6). There is no `auto`: one host class measured, a gain of a tenth, opt-in only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shared.errors import ModelLoadError
from workers.engine.cpu_features import HostCPU, host_cpu

INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")  # int8 dot products in one instruction


@dataclass(frozen=True)
class FlowPrecisionChoice:
    name: str  # "native" | "int8"
    reason: str


def int8_flow_blocked(
    *, family: str, device: torch.device, backend: str, host: HostCPU | None = None
) -> str | None:
    """Why the int8 products cannot serve this engine's flow (None: they can)."""
    if family != "cosyvoice2":
        return f"covers CosyVoice 2's flow only (this model directory is {family})"
    if device.type != "cpu" or backend != "torch":
        return f"runs on the CPU with the torch backend only, not {backend} on {device.type}"
    host = host or host_cpu()
    if not set(INT8_DOT_FLAGS) & set(host.flags):
        return (
            f"needs int8 dot-product instructions ({', '.join(INT8_DOT_FLAGS)}); "
            f"{host.model} has none"
        )
    return None


def choose_flow_precision(
    setting: str,
    *,
    device: torch.device,
    backend: str = "torch",
    family: str = "cosyvoice2",
    host: HostCPU | None = None,
) -> FlowPrecisionChoice:
    """A `COSYQ_FLOW_PRECISION` value -> the flow's products; int8 where it cannot run is a
    configuration error (ModelLoadError, one line)."""
    if setting == "native":
        return FlowPrecisionChoice("native", "COSYQ_FLOW_PRECISION=native")
    if setting != "int8":
        raise ValueError(f"COSYQ_FLOW_PRECISION: expected native or int8, got {setting!r}")
    blocked = int8_flow_blocked(family=family, device=device, backend=backend, host=host)
    if blocked is not None:
        raise ModelLoadError(f"COSYQ_FLOW_PRECISION=int8 {blocked}: set it to native")
    return FlowPrecisionChoice("int8", "COSYQ_FLOW_PRECISION=int8 (set explicitly)")
