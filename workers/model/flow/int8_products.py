"""The flow estimator's large products in 8 bits through ONNX Runtime: measured, not an option.

Each transformer block of CosyVoice 2's U-Net estimator does four large products per call on
2 x frames rows: q|k|v (256 -> 1536), the attention's output (512 -> 256) and the feed-forward
(256 -> 1024, GELU, 1024 -> 256). Here each becomes ORT's `DynamicQuantizeMatMul` (com.microsoft):
the rows are quantized to uint8 per call (one scale and zero point per call), the weight is int8
with one scale per output channel (symmetric, max |w| / 127), and the product runs on the CPU's
int8 dot products (VNNI on Zen 4 and Ice Lake onwards), then the bias is added in float32. Per
block: q|k|v is one session, the output projection one, the feed-forward one (DQMM, GELU, DQMM).
Attention, norms, convolutions and the rest stay in PyTorch at the flow's dtype; the rows go to
float32 for ORT and back.

Where the CPU has no int8 dot-product instruction (VNNI), ORT's u8 x s8 kernel adds pairs of
products into 16 bits with saturation (x86's `vpmaddubsw`): 255 x 127 twice overflows, and on a
Zen 3 the mel fell to 27 dB against fp32 (51.6 with VNNI). `weight_range` probes that once with
one saturating product and quantizes the weights to 7 bits there (|q| <= 63, ORT's own
`reduce_range` advice for such CPUs), so no pair can overflow: 41+ dB on the same Zen 3.

Built in memory from the loaded weights (~2 s for the full estimator), the plain weights then
emptied. Whole-piece and streamed calls both reach the products through `SelfAttention.project`,
`to_out` and `ff`. CosyVoice 2's U-Net only (`CausalConditionalDecoder`), not CosyVoice 3's DiT.

Issue 50 asked for this where it pays on VNNI/AMX hosts. On a Zen 4 (AVX512-VNNI/BF16) it did
not: `cosyq-worker bench flow --flow-precision int8` put the FULL flow at 0.83-1.27x bf16's time
round by round (median ~1.0x; each product alone ran 0.6-0.85x bf16's, but they are 44% of the
estimator and the rows' conversions and ORT calls take the rest back), mel 37.9 dB against fp32
(bf16 39.6). So no worker setting uses it; the bench keeps it to re-measure on an AMX host
(docs/benchmarks.md, "The flow's products in int8").
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from torch import Tensor, nn

from workers.model.flow.estimator import (
    FeedForward,
    GeluProjection,
    SelfAttention,
    TransformerBlock,
)

if TYPE_CHECKING:
    import onnxruntime as ort

MS_DOMAIN = "com.microsoft"
INT8_MAX = 127.0  # symmetric weights: q = round(w / scale), scale = max |w| / 127 per channel
REDUCED_MAX = 63.0  # 7-bit weights where pairs of u8 x s8 products saturate 16 bits
PROBE_K = 64  # the probe's inputs: 32 pairs of 255 x 127, each pair over 32,767


def int8_channels(weight: Tensor, limit: float = INT8_MAX) -> tuple[np.ndarray, np.ndarray]:
    """(out, in) weight -> int8 (in, out) (ORT's B layout) and float32 scales (out,), |q| <=
    `limit`."""
    array = (weight.to_dense() if weight.is_mkldnn else weight).detach().float().numpy()
    scale = np.abs(array).max(axis=1) / limit
    scale[scale == 0] = 1.0  # an all-zero channel: any scale gives zeros
    q = np.clip(np.rint(array / scale[:, None]), -limit, limit).astype(np.int8)
    return np.ascontiguousarray(q.T), scale.astype(np.float32)


def probe_product(limit: float) -> float:
    """ORT's int8 product of a row of 64 ones and a weight of 64 ones, the weight quantized to
    |q| <= `limit`: rows quantize to 255, so each pair is 2 x 255 x limit (exact: 64.0)."""
    g = _GraphBuilder(limit)
    y = g.product("probe", "x", torch.ones(1, PROBE_K), None)
    session = g.session(y, PROBE_K, 1, threads=1)
    (out,) = session.run([y], {"x": np.ones((1, PROBE_K), dtype=np.float32)})
    return float(out[0, 0])


@functools.cache
def weight_range() -> float:
    """INT8_MAX where ORT's int8 product is exact for full-range weights on this CPU (VNNI),
    else REDUCED_MAX (pairs saturate 16 bits: `probe_product` gives ~32 for 64)."""
    return INT8_MAX if abs(probe_product(INT8_MAX) - PROBE_K) < 1.0 else REDUCED_MAX


def _dense(linear: nn.Linear) -> tuple[Tensor, Tensor | None]:
    weight, bias = linear.weight, linear.bias
    weight = weight.to_dense() if weight.is_mkldnn else weight
    return weight.detach().float(), None if bias is None else bias.detach().float()


class _GraphBuilder:
    """Nodes and initializers of one small product graph, x (rows, in) -> y (rows, out)."""

    def __init__(self, limit: float) -> None:
        from onnx import helper  # noqa: PLC0415 (onnx only when int8 is chosen)

        self.helper = helper
        self.limit = limit  # the weights' |q| bound (`weight_range`)
        self.nodes: list[object] = []
        self.inits: list[object] = []

    def product(self, name: str, x: str, weight: Tensor, bias: Tensor | None) -> str:
        from onnx import numpy_helper  # noqa: PLC0415

        q, scale = int8_channels(weight, self.limit)
        zeros = np.zeros(scale.shape, dtype=np.int8)
        arrays = {f"{name}.q": q, f"{name}.scale": scale, f"{name}.zero": zeros}
        if bias is not None:
            arrays[f"{name}.bias"] = bias.numpy().astype(np.float32)
        self.inits += [numpy_helper.from_array(a, n) for n, a in arrays.items()]
        out = f"{name}.y"
        node = self.helper.make_node(
            "DynamicQuantizeMatMul", [x, *arrays], [out], name=name, domain=MS_DOMAIN
        )
        self.nodes.append(node)
        return out

    def gelu(self, x: str) -> str:
        self.nodes.append(self.helper.make_node("Gelu", [x], ["gelu"], domain=MS_DOMAIN))
        return "gelu"

    def session(self, y: str, k: int, n: int, threads: int) -> ort.InferenceSession:
        import onnxruntime as ort  # noqa: PLC0415
        from onnx import TensorProto  # noqa: PLC0415

        h = self.helper
        graph = h.make_graph(
            self.nodes,
            "int8_products",
            [h.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", k])],
            [h.make_tensor_value_info(y, TensorProto.FLOAT, ["rows", n])],
            self.inits,
        )
        model = h.make_model(
            graph, opset_imports=[h.make_opsetid("", 17), h.make_opsetid(MS_DOMAIN, 1)]
        )
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        # The same cores run PyTorch between products: spinning ORT threads would steal them.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )


class Int8Product(nn.Module):
    """x (..., in) -> (..., out) at x's dtype: one ORT session of int8 products (and GELU)."""

    def __init__(self, session: ort.InferenceSession, output: str, k: int, n: int) -> None:
        super().__init__()
        self.session, self.output, self.k, self.n = session, output, k, n

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.k).float().contiguous()
        (y,) = self.session.run([self.output], {"x": rows.numpy()})
        return torch.from_numpy(y).view(*x.shape[:-1], self.n).to(x.dtype)


def int8_linear(parts: Sequence[nn.Linear], threads: int) -> Int8Product:
    """One product for `parts` (Linears sharing an input), their outputs concatenated."""
    pairs = [_dense(part) for part in parts]
    weight = torch.cat([w for w, _ in pairs])
    bias = None
    if any(b is not None for _, b in pairs):
        bias = torch.cat([w.new_zeros(w.shape[0]) if b is None else b for w, b in pairs])
    g = _GraphBuilder(weight_range())
    y = g.product("p", "x", weight, bias)
    n, k = weight.shape
    return Int8Product(g.session(y, k, n, threads), y, k, n)


def int8_feed_forward(ff: FeedForward, threads: int) -> Int8Product:
    """`FeedForward` (Linear, exact GELU, Linear) as one session."""
    w0, b0 = _dense(cast(GeluProjection, ff.net["0"]).proj)
    w2, b2 = _dense(cast(nn.Linear, ff.net["2"]))
    g = _GraphBuilder(weight_range())
    y = g.product("ff2", g.gelu(g.product("ff0", "x", w0, b0)), w2, b2)
    return Int8Product(g.session(y, w0.shape[1], w2.shape[0], threads), y, w0.shape[1], w2.shape[0])


def _emptied(linear: nn.Linear) -> None:
    """Drop a replaced Linear's weights (the int8 session holds its own copy)."""
    linear.weight = nn.Parameter(linear.weight.new_empty(0), requires_grad=False)
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.new_empty(0), requires_grad=False)


def quantize_products(estimator: nn.Module, *, threads: int) -> int:
    """Every transformer block's products under `estimator` in int8; the count of blocks."""
    blocks = [m for m in estimator.modules() if isinstance(m, TransformerBlock)]
    for block in blocks:
        attn: SelfAttention = block.attn1
        parts = [attn.to_q, attn.to_k, attn.to_v]
        attn.qkv = int8_linear(parts, threads)
        for part in parts:
            _emptied(part)
        attn.to_out[0] = int8_linear([cast(nn.Linear, attn.to_out[0])], threads)
        block.ff = int8_feed_forward(block.ff, threads)  # type: ignore[assignment]
    return len(blocks)
