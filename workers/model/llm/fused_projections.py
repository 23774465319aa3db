"""One product for q/k/v and one for gate/up in each Qwen2 layer, for bf16 decoding on CPU.

Decoding one row is a chain of matrix-vector products, and the small ones run far from memory
bandwidth: the 128 x 896 k and v projections read ~8 GB/s where a 4864 x 896 one reads ~19
(oneDNN, packed bf16, AMD EPYC Zen 4, 2 threads). Concatenated, q/k/v per layer took 101-127 us
against 187-286 us as three products, gate/up 686-989 us against 776-1286 us (probe over 24
layers' weights). The concatenated weights are the rows of the originals, so every output
element is the same dot product as before; the originals are left empty (no second copy).
Only where `pack_linear_weights` packs bf16 weights: fp32 weights stay mapped from the file.
"""

from __future__ import annotations

import torch
from torch import nn

from workers.model.cpu_linear import Linear, bf16_packing_available
from workers.model.llm.qwen2 import Qwen2Attention, Qwen2MLP


def _concatenated(parts: list[Linear]) -> Linear:
    weight = torch.cat([part.weight.detach() for part in parts])
    bias = parts[0].bias
    with torch.device("meta"):
        fused = Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    fused.kernel = parts[0].kernel
    fused.weight = nn.Parameter(weight, requires_grad=False)
    if bias is not None:
        biases = [part.bias.detach() for part in parts if part.bias is not None]
        fused.bias = nn.Parameter(torch.cat(biases), requires_grad=False)
    for part in parts:  # emptied: the fused layer holds their rows now
        part.weight = nn.Parameter(part.weight.new_empty(0), requires_grad=False)
        if part.bias is not None:
            part.bias = nn.Parameter(part.bias.new_empty(0), requires_grad=False)
    return fused


def _fusable(parts: list[Linear]) -> bool:
    return all(
        part.weight.device.type == "cpu"
        and part.weight.dtype == torch.bfloat16
        and not part.weight.is_mkldnn
        and part.weight.numel() > 0
        and part.kernel in ("onednn", "gemv")
        and len({p.kernel for p in parts}) == 1
        for part in parts
    )


def fuse_projections(model: nn.Module) -> int:
    """Fuse every bf16 CPU Qwen2 layer's q/k/v and gate/up projections; the count fused."""
    if not bf16_packing_available():
        return 0
    fused = 0
    for module in model.modules():
        if isinstance(module, Qwen2Attention) and module.qkv_proj is None:
            parts = [module.q_proj, module.k_proj, module.v_proj]
            if _fusable(parts):
                module.qkv_proj = _concatenated(parts)
                fused += 1
        elif isinstance(module, Qwen2MLP) and module.gate_up_proj is None:
            parts = [module.gate_proj, module.up_proj]
            if _fusable(parts):
                module.gate_up_proj = _concatenated(parts)
                fused += 1
    return fused
