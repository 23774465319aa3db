"""Each stage's floor on the machine at hand, so the bench can say how far from it a stage runs.

Measured here, not quoted: memory bandwidth (the best of a few reductions over a buffer far
larger than the caches) and the GEMM rate in the stage's dtype (the best of a few large
products through the same linear the model uses). From them:
- LLM decode floor per token = the bytes one step must read (every weight but the embedding
  tables, of which it reads one row) / bandwidth: decoding one row is bandwidth-bound;
- flow and HiFT floors = their FLOPs (counted over one real pass with `FlopCounterMode`) / the
  GEMM rate: both are compute-bound;
- the flow's share of time that is not matrix products, from `torch.profiler` over one pass.
Best-of-N makes the rates the least disturbed by a shared host (load lowers them, never raises
them), so a floor is never flattered by load; the ratios beside it are what to read.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from workers.model.cpu_attention import ATTENTION_RANGE
from workers.model.cpu_linear import linear

BANDWIDTH_BYTES = 512 * 1024 * 1024  # 16x a 32 MB L3
GEMM_SIZE = 1024  # (1024 x 1024) @ (1024 x 1024): 2.1 GFLOP, the flow's widest shapes
REPEATS = 5
EMBEDDING_TABLES = ("embed_tokens", "speech_embedding", "llm_embedding", "lm_head")
MATMUL_OPS = (
    "mkldnn::_linear_pointwise",
    "mkldnn::_convolution_pointwise",
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::mkldnn_convolution",
    "aten::_convolution",
    "aten::convolution",
    "aten::conv1d",
)
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu",)


def best_seconds(step: Callable[[], object], repeats: int = REPEATS) -> float:
    step()  # warm: first-touch pages, oneDNN primitive creation
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        best = min(best, time.perf_counter() - start)
    return best


def memory_bandwidth_gbs() -> float:
    """Bytes read per second by a sum over BANDWIDTH_BYTES of fp32 (best of REPEATS)."""
    buffer = torch.ones(BANDWIDTH_BYTES // 4)
    seconds = best_seconds(buffer.sum)
    return BANDWIDTH_BYTES / seconds / 1e9


def gemm_gflops(dtype: torch.dtype) -> float:
    """FLOP/s of a GEMM_SIZE^3 product in `dtype` through the model's linear (oneDNN for fp32)."""
    x = torch.randn(GEMM_SIZE, GEMM_SIZE).to(dtype)
    w = torch.randn(GEMM_SIZE, GEMM_SIZE).to(dtype)
    seconds = best_seconds(lambda: linear(x, w))
    return 2 * GEMM_SIZE**3 / seconds / 1e9


def decode_bytes_per_step(llm: torch.nn.Module) -> int:
    """What one decode step reads: every parameter but the embedding tables (one row each)."""
    seen: set[int] = set()
    total = 0
    for name, param in llm.named_parameters(remove_duplicate=False):
        if id(param) in seen or any(table in name for table in EMBEDDING_TABLES):
            continue
        seen.add(id(param))
        total += param.numel() * param.element_size()
    return total


def _linear_flops(x_shape: Any, w_shape: Any, *_args: Any, **_kwargs: Any) -> int:
    return 2 * math.prod(x_shape[:-1]) * w_shape[0] * w_shape[1]


def _packed_conv_flops(
    _x_shape: Any, w_shape: Any, *_args: Any, out_shape: Any, **_kwargs: Any
) -> int:
    """A packed-weight convolution (`cpu_conv`): each output element is C_in/groups x kernel
    multiply-adds (the weight is (C_out, C_in/groups, 1, k))."""
    return 2 * math.prod(out_shape) * math.prod(w_shape[1:])


def _sdpa_flops(q_shape: Any, k_shape: Any, v_shape: Any, *_args: Any, **_kwargs: Any) -> int:
    """Q·Kᵀ and P·V: 2·B·H·Lq·Lk·(dk + dv)."""
    *batch, lq, dk = q_shape
    return 2 * math.prod(batch) * lq * k_shape[-2] * (dk + v_shape[-1])


def count_flops(step: Callable[[], object]) -> int:
    """FLOPs of one call of `step` (matmuls, convolutions, our oneDNN linear, CPU attention)."""
    mapping = {
        torch.ops.mkldnn._linear_pointwise: _linear_flops,
        torch.ops.mkldnn._convolution_pointwise: _packed_conv_flops,
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa_flops,
    }
    with FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        step()
    return int(counter.get_total_flops())


@dataclass(frozen=True)
class OpShares:
    """Where one profiled pass spent its time (shares of its wall time)."""

    wall_s: float
    matmul: float  # linear layers and convolutions
    attention: float
    other_ops: float  # norms, activations, elementwise, copies
    outside_ops: float  # Python and dispatch between ops

    @property
    def not_matmul(self) -> float:
        return 1.0 - self.matmul


def _group(key: str) -> str | None:
    if key in MATMUL_OPS:
        return "matmul"
    if key in ATTENTION_OPS:
        return "attention"
    if key.startswith(("aten::", "mkldnn::")):
        return "other"
    return None


def _inside_attention_ranges(events: Any) -> list[tuple[str, float]]:
    """(group, self seconds) of every op run inside a `cpu_attention` range."""
    found: list[tuple[str, float]] = []
    for event in events:
        if event.name != ATTENTION_RANGE:
            continue
        stack = list(event.cpu_children)
        while stack:
            child = stack.pop()
            stack.extend(child.cpu_children)
            group = _group(child.name)
            if group is not None and group != "attention":
                found.append((group, child.self_cpu_time_total / 1e6))
    return found


def op_shares(step: Callable[[], object]) -> OpShares:
    """Profile one call of `step` (CPU ops' self time, grouped)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        step()
        wall = time.perf_counter() - start
    groups = {"matmul": 0.0, "attention": 0.0, "other": 0.0}
    for event in prof.key_averages():
        group = _group(event.key)
        if group is not None:
            groups[group] += event.self_cpu_time_total / 1e6
    for inner, seconds in _inside_attention_ranges(prof.events()):
        groups[inner] -= seconds  # the blocked CPU attention's products and softmax
        groups["attention"] += seconds
    share = {k: v / wall for k, v in groups.items()}
    return OpShares(
        wall_s=wall,
        matmul=share["matmul"],
        attention=share["attention"],
        other_ops=share["other"],
        outside_ops=max(0.0, 1.0 - sum(share.values())),
    )


@dataclass(frozen=True)
class Floors:
    """The machine's rates and each stage's floor for the bench's request."""

    bandwidth_gbs: float
    gemm_gflops: dict[str, float]  # per dtype name used by a stage
    llm_bytes_per_step: int
    llm_ms_per_token: float  # floor
    flow_gflop: float
    flow_s: float  # floor
    hift_gflop: float
    hift_s: float  # floor
    flow_ops: OpShares

    def as_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["flow_ops"]["not_matmul"] = self.flow_ops.not_matmul
        return doc


def measure_floors(engine: Any, voice: Any, tokens: int, precisions: dict[str, str]) -> Floors:
    """Rates, then one flow and one HiFT pass on `tokens` speech tokens of `voice` (counted,
    then profiled). `precisions`: each stage's dtype name (the GEMM rate is taken in each)."""
    used = {precisions["flow"], precisions["hift"]}  # the GEMM-bound stages
    dtypes = {name: getattr(torch, _TORCH_NAMES[name]) for name in used}
    rates = {name: gemm_gflops(dtype) for name, dtype in dtypes.items()}
    bandwidth = memory_bandwidth_gbs()
    ids = np.random.default_rng(0).integers(0, 4096, size=tokens, dtype=np.int64)
    flow_pass = lambda: engine.flow.mel(ids, voice)  # noqa: E731
    mel = flow_pass()
    generator = torch.Generator().manual_seed(0)
    flow_flops = count_flops(flow_pass)
    hift_flops = count_flops(lambda: engine.vocoder.waveform(mel, generator))
    model = engine.llm.model
    step_bytes = getattr(model, "step_bytes", None)  # the int8 ORT step: its graph's weights
    llm_bytes = step_bytes() if step_bytes is not None else decode_bytes_per_step(model)
    return Floors(
        bandwidth_gbs=bandwidth,
        gemm_gflops=rates,
        llm_bytes_per_step=llm_bytes,
        llm_ms_per_token=1e3 * llm_bytes / (bandwidth * 1e9),
        flow_gflop=flow_flops / 1e9,
        flow_s=flow_flops / (rates[precisions["flow"]] * 1e9),
        hift_gflop=hift_flops / 1e9,
        hift_s=hift_flops / (rates[precisions["hift"]] * 1e9),
        flow_ops=op_shares(flow_pass),
    )


_TORCH_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
_NAMES = {getattr(torch, v): k for k, v in _TORCH_NAMES.items()}


def _dtype_of(module: Any) -> str:
    param = next(module.parameters(), None) if module is not None else None
    return _NAMES.get(param.dtype, str(param.dtype)) if param is not None else "n/a"


def _llm_dtype(llm: Any) -> str:
    """The LLM's compute dtype, read from its body: its text table may stay a float32 mapping
    of the checkpoint (CosyVoice 3's comes first among its parameters)."""
    if llm is None:
        return "n/a"
    for name, param in llm.named_parameters():
        if not any(table in name for table in EMBEDDING_TABLES):
            return _NAMES.get(param.dtype, str(param.dtype))
    return _dtype_of(llm)


def stage_precisions(engine: Any) -> dict[str, str]:
    """The dtype each stage really computes in, read from its weights (HiFT's F0 predictor
    and its source/STFT parts may differ from its convolutions)."""
    hift = getattr(engine.vocoder, "model", None)
    llm = getattr(engine.llm, "model", None)
    return {
        "llm": getattr(llm, "precision", None) or _llm_dtype(llm),
        "flow": _dtype_of(getattr(engine.flow, "model", None)),
        "hift": _dtype_of(getattr(hift, "conv_pre", None)),
        "hift_f0_predictor": _dtype_of(getattr(hift, "f0_predictor", None)),
        "hift_source_stft": _dtype_of(getattr(hift, "m_source", None)),
    }
