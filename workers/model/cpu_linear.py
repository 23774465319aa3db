"""`nn.Linear` that runs through oneDNN on x86 CPUs: same parameters, same keys, about 2x faster.

PyTorch's CPU `F.linear` calls MKL's sgemm. On the AMD EPYC hosts our Linux workers run on, MKL
takes a generic code path: a 600x256 @ 256x1024 fp32 product ran at 113 GFLOP/s on one thread,
while oneDNN's inner-product primitive (what PyTorch uses for convolutions) ran it at 244 GFLOP/s.
`Linear.forward` uses oneDNN when that is safe and otherwise is exactly `nn.Linear`:
- CPU float32 tensors on an x86 machine whose PyTorch build has oneDNN (not MPS/CUDA/arm64);
- no autograd (the oneDNN op has no backward);
- not inside `torch.jit.trace`/`script` or `torch.compile`: converters (Core ML) must see a plain
  linear op.
Both compute in float32 with float32 accumulation (PyTorch's default oneDNN fp32 math mode);
results differ only in rounding order, which the reference parity checks cover.
"""

from __future__ import annotations

import platform

import torch
import torch.nn.functional as F
from torch import Tensor, nn

X86_MACHINES = frozenset({"x86_64", "amd64", "i686"})


def _onednn_available() -> bool:
    if platform.machine().lower() not in X86_MACHINES or not torch.backends.mkldnn.is_available():
        return False
    return hasattr(torch.ops.mkldnn, "_linear_pointwise")


ONEDNN_LINEAR = _onednn_available()


def _use_onednn(x: Tensor, weight: Tensor) -> bool:
    return (
        ONEDNN_LINEAR
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and not torch.jit.is_tracing()
        and not torch.jit.is_scripting()
        and not torch.compiler.is_compiling()
    )


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`F.linear(x, weight, bias)`, through oneDNN when `_use_onednn` allows it."""
    if _use_onednn(x, weight):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """Drop-in `nn.Linear` (same `weight`/`bias` keys) whose forward is `linear` above."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
