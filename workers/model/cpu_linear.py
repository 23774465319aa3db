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
results differ only in rounding order, which the reference parity checks cover. On Intel hosts
with AMX, MKL's gemv uses every thread and one fp32 row reads faster through `torch.mv`
(`fp32_row_as_mv_pays`: the LLM's fp32 decode 0.85x the time); more rows stay on oneDNN.

bf16 on CPU: `pack_linear_weights` replaces each bf16 weight by oneDNN's packed (blocked) copy
of it, in place of the plain one (no second copy), where the CPU has native bf16 dot products.
`F.linear` on a plain bf16 weight re-lays it out on every call: one row through a 4864 x 896
weight read 11.6 GB/s, through the packed copy 19.3 GB/s (AMD EPYC Zen 4, 2 threads); on rows
(B, in) the result is `F.linear`'s bitwise, elsewhere within one bf16 rounding. A full-size
LLM's bf16 decode: 68.4 against 84.5 ms/token (`cosyq-worker bench llm --dtype bf16`, then
`--kernel torch`). fp32 weights stay plain and memory-mapped: packing them gained nothing
measurable (21.6 against 22.4 GB/s).

The packed layout is the one oneDNN picks for `PACKED_ROWS_HINT` rows. On AMX hosts a hint of 1
gives 64-column blocks whose AMX kernel ran 1.3-1.7x slower than the 32-column blocks any hint
from 2 up gives, at every row count the LLM sees (1, 8, 16, 120); with AVX512-BF16 alone every
hint gives the same speed (see `PACKED_ROWS_HINT`).

The LLM's bf16 weights on AMX hosts stay plain instead, under the "gemv" kernel
(`weight_first_linear`): the weight is the left operand (`W @ x`), which oneDNN's AMX kernel
streams row by row: one row's product took 0.62-0.99x the packed inner product's time (see
`weight_first_linear`). Every row count gives each row the same bits, so a batched
decode step is still bit for bit the alone one.
"""

from __future__ import annotations

import functools
import platform

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workers.model.cpu_isa import has_amx_tiles

X86_MACHINES = frozenset({"x86_64", "amd64", "i686"})
LINEAR_KERNELS = ("torch", "onednn", "gemv")
# Rows oneDNN is told to expect when it lays a bf16 weight out. Intel Xeon with AMX (family 6
# model 207), 2 threads, interleaved: a 9728 x 896 product took 0.69-0.74x the time of hint 1's
# layout at M = 1/8/16, 0.59x at M = 120; the whole LLM 86.7 against 105.0 ms/token, prefill 86
# against 149 ms; a non-streaming flow pass 3.74 against 4.29 s. Capped at AVX512-BF16
# (`ONEDNN_MAX_CPU_ISA`), hints 1-256 ran within 5% of each other.
PACKED_ROWS_HINT = 16


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


@functools.cache
def bf16_packing_available() -> bool:
    """True where oneDNN runs bf16 natively (AVX512-BF16 or AMX) and a packed weight's product
    equals the plain one's (probed once on a tiny product)."""
    if not onednn_available() or not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False
    try:
        x = torch.linspace(-1, 1, 32).view(2, 16).bfloat16()
        w = torch.linspace(-2, 2, 16 * 8).view(8, 16).bfloat16()
        packed = torch.ops.mkldnn._reorder_linear_weight(w, PACKED_ROWS_HINT)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
    except (AttributeError, RuntimeError, NotImplementedError):
        return False
    return bool(torch.equal(y, F.linear(x, w)))


def cpu_inference(x: Tensor, weight: Tensor) -> bool:
    """A CPU input outside tracing, scripting, compiling and autograd: where a kernel of our
    own choosing may replace `F.linear` (converters must see the plain op; ours have no
    backward)."""
    return (
        not torch.jit.is_tracing()
        and not torch.jit.is_scripting()
        and not torch.compiler.is_compiling()
        and x.device.type == "cpu"
        and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
    )


def _use_onednn(x: Tensor, weight: Tensor) -> bool:
    """Tracing is ruled out before the probe: a first probe inside torch.jit.trace asserts."""
    return (
        cpu_inference(x, weight)
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and onednn_available()
    )


def _packed_linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """A packed (mkldnn-layout) weight: oneDNN on a matching CPU input, else its plain copy."""
    if _packed_runs(x, weight):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight.to_dense().to(x.dtype), bias)


def _packed_runs(x: Tensor, weight: Tensor) -> bool:
    return (
        weight.is_mkldnn
        and x.device.type == "cpu"
        and x.dtype == weight.dtype
        and not torch.jit.is_tracing()
    )


def linear_gelu(layer: nn.Linear, x: Tensor, approximate: str = "none") -> Tensor:
    """`F.gelu(layer(x), approximate=approximate)`; on a packed weight one oneDNN product with
    the GELU as its post-op (computed on the fp32 accumulator, rounded to bf16 once).

    A full-size DiT feed-forward's first product (200 x 1024 -> 2048, bf16, AMD EPYC Zen 4):
    55.6 dB against fp64 where the product and a separate GELU give 51.4, and no pass over
    the (rows, 2048) output in between. Elsewhere (fp32, plain weights, tracing) the two ops.
    """
    if _packed_runs(x, layer.weight):
        return torch.ops.mkldnn._linear_pointwise(
            x, layer.weight, layer.bias, "gelu", [], approximate
        )
    return F.gelu(layer(x), approximate=approximate)


def _use_gemv(x: Tensor, weight: Tensor) -> bool:
    return cpu_inference(x, weight) and x.dtype == weight.dtype and not weight.is_mkldnn


def weight_first_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`F.linear(x, weight) + bias` computed as `weight @ x.T` (one row: `torch.mv`), the bias
    added after rounding, so a row's result does not depend on how many rows came with it.

    Intel Xeon with AMX (family 6 model 207), 2 threads, interleaved, against the packed
    weight: one row 0.62x the time (896 x 4864), 0.70 (1152 x 896), 0.83 (6564 x 896), 0.99
    (9728 x 896); 8-16 rows 0.60-0.98; the whole LLM's bf16 decode 62.2 against 77.3 ms/token
    (median of four alternating runs), a 112-position prefill 159 against 110 ms (`F.linear`
    on the plain weight: 228 ms).

    Several rows come back column-major (the transposed view of `weight @ x.T`): copying it
    row-major cost more than what reads it later saves (another Xeon with AMX: 16 rows of
    9728 x 896 0.92 against 0.74 ms; a 16-row bf16 decode step 69.2 against 66.7 ms, a
    112-position prefill 131 against 115 ms, the same bits)."""
    rows = x.reshape(-1, x.size(-1))
    if rows.size(0) == 1:
        y = torch.mv(weight, rows[0]).unsqueeze(0)
    else:
        y = torch.mm(weight, rows.t()).t()
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], weight.size(0))


def gemv_pays(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether an LLM on `device`/`dtype` should decode with the "gemv" kernel: bf16 on a CPU
    with AMX tiles (on AVX512-BF16 alone `torch.mv` read 5-7 GB/s against the packed
    weight's 13-15)."""
    return device.type == "cpu" and dtype == torch.bfloat16 and has_amx_tiles()


def fp32_row_as_mv_pays() -> bool:
    """Whether one fp32 row should go through `torch.mv` (`weight_first_linear`) rather than
    oneDNN: on CPUs with AMX tiles (Intel Xeon 4th gen and later, where MKL's gemv runs on
    every intra-op thread). Intel Xeon with AMX (family 6 model 207), 2 threads, one row
    against oneDNN: 0.94x the time (9728 x 896), 0.95 (896 x 4864), 0.62 (1152 x 896), 0.65
    (896 x 896), 0.93 (6564 x 896); the full LLM's fp32 decode 62.3 and 59.7 against 71.7 and
    72.5 ms/token (`bench llm --dtype fp32 --kernel gemv` / `onednn`, alternating). More rows
    stay on oneDNN, which was faster there (8 rows 0.85x, 112 rows 0.84x of `W @ X.T`). On the
    AMD EPYC hosts MKL's gemv ran on one core: they keep oneDNN for every row count."""
    return has_amx_tiles()


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`F.linear(x, weight, bias)`, through oneDNN when `_use_onednn` allows it (one fp32 row
    through `torch.mv` where `fp32_row_as_mv_pays`)."""
    if weight.is_mkldnn:
        return _packed_linear(x, weight, bias)
    if _use_onednn(x, weight):
        if x.numel() == weight.size(1) and fp32_row_as_mv_pays():
            return weight_first_linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """Drop-in `nn.Linear` (same `weight`/`bias` keys) whose forward is `linear` above.

    `kernel` "onednn" (default) uses oneDNN where safe; "torch" always calls `F.linear`;
    "gemv" runs `weight_first_linear` on plain CPU weights (else as "torch").
    """

    kernel: str = "onednn"

    def forward(self, x: Tensor) -> Tensor:
        if self.kernel == "gemv" and _use_gemv(x, self.weight):
            return weight_first_linear(x, self.weight, self.bias)
        if self.kernel == "onednn" or self.weight.is_mkldnn:
            return linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


def llm_linear_kernel(device: torch.device, dtype: torch.dtype) -> str:
    """The LLM's kernel: "gemv" where `gemv_pays`, else `default_linear_kernel` (the flow's
    products have hundreds of rows: packed weights stay faster there)."""
    if gemv_pays(device, dtype) and bf16_packing_available():
        return "gemv"
    return default_linear_kernel(device, dtype)


def default_linear_kernel(device: torch.device, dtype: torch.dtype) -> str:
    """ "onednn" where it can ever run (float32 on an x86 CPU with oneDNN, bf16 where its
    weights can be packed), else "torch"."""
    if device.type == "cpu" and dtype == torch.float32 and onednn_available():
        return "onednn"
    if device.type == "cpu" and dtype == torch.bfloat16 and bf16_packing_available():
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
            if kernel != "onednn" and sub.weight.is_mkldnn:  # "torch"/"gemv" read it plain
                sub.weight = nn.Parameter(sub.weight.to_dense(), requires_grad=False)


def pack_linear_weights(module: nn.Module) -> int:
    """Replace every CPU bf16 `Linear` weight under `module` (kernel "onednn") by oneDNN's
    packed copy, one at a time (the plain one is freed as it goes); the count packed.

    A no-op where `bf16_packing_available` is false. The packed weight keeps its shape and
    dtype (`weight.is_mkldnn` is true); `weight.to_dense()` gives the plain tensor back."""
    if not bf16_packing_available():
        return 0
    packed = 0
    for sub in module.modules():
        weight = getattr(sub, "weight", None)
        if (
            isinstance(sub, Linear)
            and sub.kernel == "onednn"
            and weight is not None
            and not weight.is_mkldnn
            and weight.dim() == 2  # not a layer emptied by fusion (`fused_projections`)
            and weight.device.type == "cpu"
            and weight.dtype == torch.bfloat16
        ):
            blocked = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACKED_ROWS_HINT)
            sub.weight = nn.Parameter(blocked, requires_grad=False)
            packed += 1
    return packed


def linear_kernel(module: nn.Module) -> str:
    """The kernel of the first `Linear` under `module` ("torch" when it has none)."""
    return next((sub.kernel for sub in module.modules() if isinstance(sub, Linear)), "torch")


def concatenated_linear(parts: list[Linear]) -> Linear:
    """One `Linear` whose weight is `parts`' weights stacked (rows in order): each output
    element the same dot product as before. The parts are left empty (no second copy)."""
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


def fusable(parts: list[Linear]) -> bool:
    """Whether `parts` may be concatenated: plain bf16 CPU weights that `pack_linear_weights`
    will pack (fp32 weights stay mapped from the file), one kernel for all."""
    return bf16_packing_available() and all(
        part.weight.device.type == "cpu"
        and part.weight.dtype == torch.bfloat16
        and not part.weight.is_mkldnn
        and part.weight.numel() > 0
        and part.kernel in ("onednn", "gemv")
        and len({p.kernel for p in parts}) == 1
        and (part.bias is None) == (parts[0].bias is None)
        for part in parts
    )
