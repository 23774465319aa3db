"""One product for q/k/v and one for gate/up in each Qwen2 layer, for bf16 decoding on CPU.

Decoding one row is a chain of matrix-vector products, and the small ones run far from memory
bandwidth: the 128 x 896 k and v projections read ~8 GB/s where a 4864 x 896 one reads ~19
(oneDNN, packed bf16, AMD EPYC Zen 4, 2 threads). Concatenated, q/k/v per layer took 101-127 us
against 187-286 us as three products, gate/up 686-989 us against 776-1286 us (probe over 24
layers' weights). The concatenated weights are the rows of the originals, so every output
element is the same dot product as before; the originals are left empty (no second copy).
Only where `pack_linear_weights` packs bf16 weights: fp32 weights stay mapped from the file.
The concatenation is `cpu_linear.concatenated_linear` (the DiT's q/k/v use it too).
"""

from __future__ import annotations

from torch import nn

from workers.model.cpu_linear import bf16_packing_available, concatenated_linear, fusable
from workers.model.llm.qwen2 import Qwen2Attention, Qwen2MLP


def fuse_projections(model: nn.Module) -> int:
    """Fuse every bf16 CPU Qwen2 layer's q/k/v and gate/up projections; the count fused."""
    if not bf16_packing_available():
        return 0
    fused = 0
    for module in model.modules():
        if isinstance(module, Qwen2Attention) and module.qkv_proj is None:
            parts = [module.q_proj, module.k_proj, module.v_proj]
            if fusable(parts):
                module.qkv_proj = concatenated_linear(parts)
                fused += 1
        elif isinstance(module, Qwen2MLP) and module.gate_up_proj is None:
            parts = [module.gate_proj, module.up_proj]
            if fusable(parts):
                module.gate_up_proj = concatenated_linear(parts)
                fused += 1
    return fused
