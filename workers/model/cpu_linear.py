"""`nn.Linear` that runs through oneDNN on x86 CPUs: same parameters, same keys, about 2x faster.

The one Linear of the LLM, the flow and anything else batch-1-heavy on CPU. PyTorch's CPU
`F.linear` calls MKL: on the AMD EPYC hosts our Linux workers run on, MKL takes a generic code
path (a 600x256 @ 256x1024 fp32 product ran at 113 GFLOP/s on one thread, oneDNN's inner product
at 244 GFLOP/s), and a single row becomes an MKL gemv that runs on one core where oneDNN uses
every intra-op thread and reaches memory bandwidth (~2x faster LLM decoding).
`Linear.forward` uses oneDNN when that is safe and otherwise is exactly `nn.Linear`:
- the module's `kernel` is "onednn" (the default; `set_linear_kernel(module, "torch")` turns it
  off for a whole model, e.g. to compare kernels);
- CPU float32 tensors on an x86 machine whose PyTorch build runs oneDNN's linear (probed once);
  not MPS/CUDA, not arm64 (Accelerate's BLAS is not the slow path this works around);
- no autograd (the oneDNN op has no backward);
- not inside `torch.jit.trace`/`script` or `torch.compile`: converters (Core ML) must see a plain
  linear op.
Both compute in float32 with float32 accumulation (PyTorch's default oneDNN fp32 math mode);
results differ only in rounding order, which the reference parity checks cover.
"""

from __future__ import annotations

import functools
import platform

import torch
import torch.nn.functional as F
from torch import Tensor, nn

X86_MACHINES = frozenset({"x86_64", "amd64", "i686"})
LINEAR_KERNELS = ("torch", "onednn")


@functools.cache
def onednn_available() -> bool:
    """True on x86 when this torch build runs oneDNN's linear (probed once on a tiny matmul)."""
    if platform.machine().lower() not in X86_MACHINES or not torch.backends.mkldnn.is_available():
        return False
    try:
        x, w, b = torch.ones(1, 4), torch.eye(4), torch.zeros(4)
        y = torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return bool(torch.equal(y, x))


def _use_onednn(x: Tensor, weight: Tensor) -> bool:
    """Tracing is ruled out before the probe: a first probe inside torch.jit.trace asserts."""
    return (
        not torch.jit.is_tracing()
        and not torch.jit.is_scripting()
        and not torch.compiler.is_compiling()
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        and onednn_available()
    )


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`F.linear(x, weight, bias)`, through oneDNN when `_use_onednn` allows it."""
    if _use_onednn(x, weight):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """Drop-in `nn.Linear` (same `weight`/`bias` keys) whose forward is `linear` above.

    `kernel` "onednn" (default) uses oneDNN where safe; "torch" always calls `F.linear`.
    """

    kernel: str = "onednn"

    def forward(self, x: Tensor) -> Tensor:
        if self.kernel == "onednn":
            return linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def default_linear_kernel(device: torch.device, dtype: torch.dtype) -> str:
    """ "onednn" where it can ever run (float32 on an x86 CPU with oneDNN), else "torch"."""
    if device.type == "cpu" and dtype == torch.float32 and onednn_available():
        return "onednn"
    return "torch"


def set_linear_kernel(module: nn.Module, kernel: str) -> None:
    """Choose the kernel of every `Linear` under `module`."""
    if kernel not in LINEAR_KERNELS:
        raise ValueError(f"linear kernel must be one of {LINEAR_KERNELS}, got {kernel!r}")
    if kernel == "onednn" and not onednn_available():
        raise ValueError("linear kernel 'onednn' is not available in this torch build")
    for sub in module.modules():
        if isinstance(sub, Linear):
            sub.kernel = kernel


def linear_kernel(module: nn.Module) -> str:
    """The kernel of the first `Linear` under `module` ("torch" when it has none)."""
    return next((sub.kernel for sub in module.modules() if isinstance(sub, Linear)), "torch")
