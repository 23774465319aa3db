"""Which kernels a loaded model runs, chosen once at load from its device and dtype.

Our CPU kernels (`cpu_linear`'s oneDNN and gemv products, packed bf16 weights in `cpu_linear`
and `cpu_conv`, the fused q/k/v and gate/up products of `fused_projections`, `cpu_attention`'s
blocked bf16 attention, the OpenMP team hand-over of `engine.openmp_pool`) exist for x86 CPUs.
On any other device (CUDA, MPS) a model gets the plain PyTorch modules: every `Linear` set to
the "torch" kernel (`F.linear`), no packing, no fusion, attention through
`F.scaled_dot_product_attention`, and the LLM's batched decode through the static KV cache
(`llm.static_decode`), which CUDA graphs can capture. Each CPU kernel still checks its input's
device per call (a safety net, not the decision): the decision is this policy, made once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from workers.model.cpu_attention import AttentionLayer
from workers.model.cpu_conv import Conv1d, pack_conv_weights
from workers.model.cpu_linear import (
    Linear,
    default_linear_kernel,
    llm_linear_kernel,
    pack_linear_weights,
    set_linear_kernel,
)
from workers.model.dit.estimator import fuse_dit_projections
from workers.model.llm.fused_projections import fuse_projections


@dataclass(frozen=True)
class KernelPolicy:
    """The kernels of one model on one device and dtype."""

    device_type: str
    llm_linear: str  # "torch" | "onednn" | "gemv"
    flow_linear: str  # "torch" | "onednn"
    pack_weights: bool  # oneDNN's packed bf16 layout for linear and conv weights
    fuse_projections: bool  # q/k/v and gate/up as one product each
    static_decode: bool  # the LLM's batched decode through a static KV cache (graph-capturable)

    @property
    def cpu_kernels(self) -> bool:
        """Whether any of our CPU-only kernels may run under this policy."""
        return self.device_type == "cpu"


def kernel_policy(device: torch.device, dtype: torch.dtype) -> KernelPolicy:
    """The policy for `device`/`dtype`: our CPU kernels on the CPU, plain PyTorch elsewhere."""
    if device.type == "cpu":
        return KernelPolicy(
            device_type="cpu",
            llm_linear=llm_linear_kernel(device, dtype),
            flow_linear=default_linear_kernel(device, dtype),
            pack_weights=True,
            fuse_projections=True,
            static_decode=False,
        )
    return KernelPolicy(
        device_type=device.type,
        llm_linear="torch",
        flow_linear="torch",
        pack_weights=False,
        fuse_projections=False,
        static_decode=device.type == "cuda",
    )


def apply_llm_policy(llm: nn.Module, policy: KernelPolicy) -> None:
    """Set the LLM's products, then (CPU bf16 only) fuse and pack them."""
    set_linear_kernel(llm, policy.llm_linear)
    if policy.fuse_projections:
        fuse_projections(llm)  # bf16 on CPU: q/k/v and gate/up as one product each, then
    if policy.pack_weights:
        pack_linear_weights(llm)  # oneDNN's layout, once nothing else holds the plain weights


def apply_stage_policy(stage: nn.Module, policy: KernelPolicy, *, rows_alone: bool) -> None:
    """Set a flow or HiFT stage's products and attention; (CPU bf16 only) fuse the DiT's
    q/k/v and pack its weights."""
    set_linear_kernel(stage, policy.flow_linear)
    for sub in stage.modules():
        if isinstance(sub, AttentionLayer):
            sub.blocked_attention = policy.cpu_kernels
    if policy.fuse_projections:
        fuse_dit_projections(stage)
    if policy.pack_weights:
        pack_linear_weights(stage)
        pack_conv_weights(stage, rows_alone=rows_alone)


def cpu_kernels_in(modules: Iterable[nn.Module]) -> list[str]:
    """Names of every place under `modules` where a CPU-only kernel could run: a `Linear`
    whose kernel is not "torch", a packed (mkldnn) weight, a fused projection. Empty for a
    model loaded under a non-CPU policy."""
    found = []
    for root in modules:
        for name, sub in root.named_modules():
            if isinstance(sub, AttentionLayer) and sub.blocked_attention:
                found.append(f"{name}: blocked attention")
            if isinstance(sub, Linear) and sub.kernel != "torch":
                found.append(f"{name}: linear kernel {sub.kernel}")
            weight = getattr(sub, "weight", None)
            if isinstance(sub, (Linear, Conv1d)) and weight is not None and weight.is_mkldnn:
                found.append(f"{name}: packed weight")
            if getattr(sub, "qkv_proj", None) is not None:
                found.append(f"{name}: fused q/k/v")
            if getattr(sub, "gate_up_proj", None) is not None:
                found.append(f"{name}: fused gate/up")
    return found
