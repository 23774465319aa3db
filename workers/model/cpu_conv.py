"""`nn.Conv1d` whose bf16 CPU weight is kept in oneDNN's packed layout: same keys, same bits.

PyTorch's CPU convolution re-lays a plain bf16 weight (and its input) out for oneDNN on every
call. The flow's estimator makes 31 convolutions a step (causal k3 and 1x1), ten steps a pass;
HiFT makes 77 over (64-512, up to 24,000 samples) inputs, where the input copies alone were a
third of the vocoder's time. `pack_conv_weights` lays each bf16 weight out once (as
`cpu_linear.pack_linear_weights` does for products), in place of the plain one, and `Conv1d`
then calls oneDNN's convolution on it. Its output comes channels-last in memory ((B, C, T) with
the strides of (B, T, C)), which the next packed conv reads without a copy, and the layer norm
over channels that follows an estimator conv reads as a contiguous (B, T, C).

Intel Xeon with AMX (family 6 model 207), 2 threads, full-size random weights, interleaved:
a (2, 256, 300) k3 conv 284 against 478 us; a non-streaming flow pass 1.78 against 1.91 s
(medians of six), HiFT on 200 frames 0.184 against 0.277 s (eight); the mel and the waveform
bit for bit the plain weights' ones. With AVX512-BF16 alone (AMD EPYC) the flow packs too, as each
piece runs alone through it in bf16 (`conv_packing_pays`). Anywhere else (fp32, other devices,
tracing for Core ML, autograd) it is `nn.Conv1d`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workers.model import cpu_linear
from workers.model.cpu_isa import has_amx_tiles


class Conv1d(nn.Conv1d):
    """Drop-in `nn.Conv1d` (zeros padding) that also runs a packed weight (`pack_conv_weights`)."""

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        if not weight.is_mkldnn:
            return super()._conv_forward(input, weight, bias)
        if input.dtype == weight.dtype and cpu_linear.cpu_inference(input, weight):
            return torch.ops.mkldnn._convolution_pointwise(
                input.unsqueeze(2),
                weight,
                bias,
                [0, *self.padding],
                [1, *self.stride],
                [1, *self.dilation],
                self.groups,
                "none",
                [],
                "",
            ).squeeze(2)
        plain = weight.to_dense().squeeze(2)  # tracing, autograd: the plain op
        return F.conv1d(input, plain, bias, self.stride, self.padding, self.dilation, self.groups)


def conv1d(conv: nn.Conv1d, x: Tensor) -> Tensor:
    """`conv`'s own product on x (its padding, stride, packed weight or plain): what its
    forward computes, for callers that pad or cache inputs themselves."""
    return conv._conv_forward(x, conv.weight, conv.bias)


def conv_packing_pays(*, rows_alone: bool = False) -> bool:
    """Whether bf16 conv weights should be packed: on CPUs with AMX tiles, always; with native
    bf16 but no AMX, for a module whose rows never share a call (`rows_alone`: in bf16 each
    piece's flow runs alone, `ModuleFlow.batches`).

    On CPUs with AMX tiles packed convolutions gave `F.conv1d`'s bits, a row alone the same
    bits as in a batch, and 0.6-0.7x the time. With AVX512-BF16 alone the packed result
    differs from the plain one in the last bits (the flow's mel 43.6 dB from the plain
    weights' over a full-size pass, where bf16 itself is 39.5 dB from fp32) and, for a dilated
    k7 conv, a row alone from the same row in a batch of 16 (oneDNN capped at that ISA on an
    AMX host): a batched request must stay bit for bit what it gives alone, so rows that may
    share calls keep plain weights there. AMD EPYC Zen 4, 2 threads, interleaved in one
    process: a non-streaming flow pass 4.011 against 4.194 s, a streamed first pass 1.650
    against 1.711 s (medians of five). HiFT, which runs each piece alone too, stays plain
    there: 0.379 against 0.416 s on 200 frames, but its first call's working memory rose from
    45-52 to 82-95 MB and `bench batch`'s B=1 peak to 1.81-1.85 GB (the 1.8 GB mark)."""
    if not cpu_linear.bf16_packing_available():
        return False
    return has_amx_tiles() or rows_alone


def pack_conv_weights(module: nn.Module, *, rows_alone: bool = False) -> int:
    """Replace every CPU bf16 `Conv1d` weight under `module` by oneDNN's packed copy, one at a
    time (the plain one is freed as it goes); the count packed. A no-op where
    `conv_packing_pays(rows_alone=...)` is false, and for padding modes other than zeros."""
    if not conv_packing_pays(rows_alone=rows_alone):
        return 0
    packed = 0
    for sub in module.modules():
        if (
            not isinstance(sub, Conv1d)
            or sub.padding_mode != "zeros"
            or isinstance(sub.padding, str)
        ):
            continue
        weight = sub.weight
        if weight.is_mkldnn or weight.device.type != "cpu" or weight.dtype != torch.bfloat16:
            continue
        blocked = torch.ops.mkldnn._reorder_convolution_weight(
            weight.detach().unsqueeze(2).contiguous(),
            [0, *sub.padding],
            [1, *sub.stride],
            [1, *sub.dilation],
            sub.groups,
        )
        sub.weight = nn.Parameter(blocked, requires_grad=False)
        packed += 1
    return packed
