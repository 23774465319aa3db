"""The LLM's step (prefill or decode, B rows) as one ONNX graph for ONNX Runtime on CPU.

Built from our own `Qwen2LM` weights with `onnx.helper` (no exporter), every product's weight
quantized to 8 bits here (`quantized_blocks`: blocks of 32 along the input, one float32 scale per
block, symmetric) for ORT's `MatMulNBits` at `accuracy_level=4` (the kernel quantizes the
activations per block too, and multiplies in int8). Per layer, ONNX Runtime's fused CPU ops:

    x -> SimplifiedLayerNormalization (RMSNorm; later layers `SkipSimplified...`, which adds
    the residual in the same pass) -> MatMulNBits q|k|v + bias -> GroupQueryAttention (rotary
    from cos/sin tables, rotate-half; the KV cache read and written in place) -> MatMulNBits o
    -> SkipSimplifiedLayerNormalization -> MatMulNBits gate|up -> SiLU(gate) * up
    -> MatMulNBits down

then the final norm on the last position only, the speech-token head (`llm_decoder`, also
8-bit) and a log-softmax. The graph's inputs and outputs:

    embeds (B, T, hidden) float32: the new positions' input embeddings
    seqlens_k (B,) int32: each row's positions after this step, minus one
    total_sequence_length () int32: the longest row's positions after this step
    past_key_<i>, past_value_<i> (B, kv_heads, capacity, head_dim) float32, i per layer
    -> logp (B, 1, decoder_size) float32: log-probs of each row's next token
    -> present_key_<i>, present_value_<i>: the same buffers (bound to the same memory, the
       op writes the T new positions in place: no copy of the cache per step)

Rows of a batch may have different lengths (`seqlens_k`), each decoding one new position.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from workers.model.llm.model import Qwen2LM
from workers.model.llm.qwen2 import Qwen2Config, Qwen2DecoderLayer

# Bump when the graph changes: the cache file's name carries it, so an old file is not reused.
GRAPH_VERSION = 1
OPSET = 21
MS_DOMAIN = "com.microsoft"
QUANT_BLOCK = 32  # input elements per int8 scale (the issue-22 probe's choice)
QUANT_ACCURACY_LEVEL = 4  # int8 activations inside MatMulNBits


@dataclass(frozen=True)
class QuantScheme:
    """How the graph's products are quantized (the default is the shipped one; the others are
    measured by `bench llm --llm-precision int8 --variants`).

    block: input elements per scale (MatMulNBits' block_size, a power of two >= 16).
    accuracy_level: MatMulNBits' compute type (0 unset, 1 fp32, 4 int8 activations).
    symmetric: zero point fixed at 128 (else one uint8 zero point per block, min..max range).
    head_int8: the speech head as MatMulNBits too (else a float32 MatMul)."""

    block: int = QUANT_BLOCK
    accuracy_level: int = QUANT_ACCURACY_LEVEL
    symmetric: bool = True
    head_int8: bool = True

    def __post_init__(self) -> None:
        if self.block < 16 or self.block & (self.block - 1):
            raise ValueError(f"block must be a power of two >= 16, got {self.block}")
        if self.accuracy_level not in (0, 1, 2, 3, 4):
            raise ValueError(f"accuracy_level must be 0-4, got {self.accuracy_level}")

    @property
    def tag(self) -> str:
        """'' for the default scheme (its file name is unchanged), else a short suffix."""
        if self == QuantScheme():
            return ""
        sym = "s" if self.symmetric else "a"
        head = "h8" if self.head_int8 else "h32"
        return f"-b{self.block}a{self.accuracy_level}{sym}{head}"


DEFAULT_SCHEME = QuantScheme()


@dataclass(frozen=True)
class GraphNames:
    """Input/output names of the step graph, shared by the builder and the runtime."""

    layers: int

    def past(self) -> Iterator[tuple[str, str]]:
        for i in range(self.layers):
            yield f"past_key_{i}", f"past_value_{i}"

    def present(self) -> Iterator[tuple[str, str]]:
        for i in range(self.layers):
            yield f"present_key_{i}", f"present_value_{i}"


class _Graph:
    """Collects nodes and initializers; small helpers name each tensor once."""

    def __init__(self, scheme: QuantScheme) -> None:
        self.scheme = scheme
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def weight(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def node(
        self, op: str, inputs: list[str], outputs: list[str], *, domain: str = "", **attrs: Any
    ) -> list[str]:
        node = helper.make_node(op, inputs, outputs, name=outputs[0], domain=domain)
        node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items())
        self.nodes.append(node)
        return outputs

    def linear(self, name: str, x: str, weight: torch.Tensor, bias: torch.Tensor | None) -> str:
        """x @ weight.T (+ bias), weight (out, in) as 8-bit `MatMulNBits` (`quantized_blocks`)."""
        n, k = weight.shape
        scheme = self.scheme
        packed, scales, zeros = quantized_blocks(
            _plain(weight).numpy(), block=scheme.block, symmetric=scheme.symmetric
        )
        inputs = [x, self.weight(f"{name}.q8", packed), self.weight(f"{name}.scales", scales)]
        if zeros is not None:
            inputs.append(self.weight(f"{name}.zeros", zeros))
        (out,) = self.node(
            "MatMulNBits",
            inputs,
            [f"{name}.matmul"],
            domain=MS_DOMAIN,
            K=k,
            N=n,
            bits=8,
            block_size=scheme.block,
            accuracy_level=scheme.accuracy_level,
        )
        return self._bias(name, out, bias)

    def dense(self, name: str, x: str, weight: torch.Tensor, bias: torch.Tensor | None) -> str:
        """x @ weight.T (+ bias) with the float32 weight (a plain MatMul)."""
        w = self.weight(f"{name}.weight_t", _plain(weight).numpy().T)
        (out,) = self.node("MatMul", [x, w], [f"{name}.matmul"])
        return self._bias(name, out, bias)

    def _bias(self, name: str, out: str, bias: torch.Tensor | None) -> str:
        if bias is None:
            return out
        b = self.weight(f"{name}.bias", _plain(bias).numpy())
        return self.node("Add", [out, b], [f"{name}.out"])[0]


def quantized_blocks(
    weight: np.ndarray, *, block: int = QUANT_BLOCK, symmetric: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(out, in) float32 -> MatMulNBits' 8-bit layout: uint8 (out, blocks, block), float32
    scales (out * blocks,) and uint8 zero points (out * blocks,) or None for the op's default
    128. Symmetric: scale = max |w| / 127, q = w / scale + 128. Asymmetric: scale =
    (max - min) / 255, zero point = round(-min / scale), q = w / scale + zero point, so each
    block's whole range uses the 256 levels. `in` is padded with zeros to whole blocks."""
    n, k = weight.shape
    blocks = -(-k // block)
    padded = np.zeros((n, blocks * block), dtype=np.float32)
    padded[:, :k] = weight
    grouped = padded.reshape(n, blocks, block)
    if symmetric:
        scale = np.abs(grouped).max(axis=-1) / 127.0
        scale[scale == 0] = 1.0  # an all-zero block: any scale gives zeros
        q = np.clip(np.rint(grouped / scale[..., None]), -127, 127) + 128
        return q.astype(np.uint8), scale.reshape(-1).astype(np.float32), None
    low = np.minimum(grouped.min(axis=-1), 0.0)  # the range holds 0 (padding is exact)
    high = np.maximum(grouped.max(axis=-1), 0.0)
    scale = (high - low) / 255.0
    scale[scale == 0] = 1.0
    zero = np.clip(np.rint(-low / scale), 0, 255)
    q = np.clip(np.rint(grouped / scale[..., None]) + zero[..., None], 0, 255)
    return (
        q.astype(np.uint8),
        scale.reshape(-1).astype(np.float32),
        zero.reshape(-1).astype(np.uint8),
    )


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """A weight as a plain float32 tensor (a bf16 LLM's packed, mkldnn-layout weights too)."""
    return (tensor.to_dense() if tensor.is_mkldnn else tensor).detach().float()


def _cat(*tensors: torch.Tensor) -> torch.Tensor:
    return torch.cat([_plain(t) for t in tensors])


def _rotary_tables(config: Qwen2Config) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin (max_positions, head_dim / 2) in float32, the angles as `rotary_at` makes them."""
    half = torch.arange(0, config.head_dim, 2, dtype=torch.int64).float()
    inv_freq = 1.0 / (config.rope_theta ** (half / config.head_dim))
    positions = torch.arange(config.max_position_embeddings).float()
    angles = positions[:, None] * inv_freq[None, :]
    return angles.cos().numpy(), angles.sin().numpy()


def _attention(g: _Graph, config: Qwen2Config, layer: Qwen2DecoderLayer, i: int, x: str) -> str:
    """Normed input x (B, T, hidden) -> attention output after o_proj (B, T, hidden)."""
    attn = layer.self_attn
    qkv_weight = _cat(attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight)
    if attn.qkv_proj is not None:  # already fused (bf16 CPU models)
        qkv_weight = _plain(attn.qkv_proj.weight)
    qkv_bias = _cat(attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias)
    if attn.qkv_proj is not None and attn.qkv_proj.bias is not None:
        qkv_bias = _plain(attn.qkv_proj.bias)
    qkv = g.linear(f"l{i}.qkv", x, qkv_weight, qkv_bias)
    past_k, past_v = f"past_key_{i}", f"past_value_{i}"
    out, _, _ = g.node(
        "GroupQueryAttention",
        [qkv, "", "", past_k, past_v, "seqlens_k", "total_sequence_length", "cos", "sin"],
        [f"l{i}.attn", f"present_key_{i}", f"present_value_{i}"],
        domain=MS_DOMAIN,
        num_heads=config.num_heads,
        kv_num_heads=config.num_kv_heads,
        scale=1.0 / math.sqrt(config.head_dim),
        do_rotary=1,
        rotary_interleaved=0,
    )
    return g.linear(f"l{i}.o", out, attn.o_proj.weight, None)


def _mlp(g: _Graph, config: Qwen2Config, layer: Qwen2DecoderLayer, i: int, x: str) -> str:
    mlp = layer.mlp
    if mlp.gate_up_proj is not None:
        weight = _plain(mlp.gate_up_proj.weight)
    else:
        weight = _cat(mlp.gate_proj.weight, mlp.up_proj.weight)
    gate_up = g.linear(f"l{i}.gate_up", x, weight, None)
    sizes = g.weight(f"l{i}.split", np.array([config.intermediate_size] * 2, dtype=np.int64))
    gate, up = g.node("Split", [gate_up, sizes], [f"l{i}.gate", f"l{i}.up"], axis=-1)
    (sig,) = g.node("Sigmoid", [gate], [f"l{i}.sigmoid"])
    (silu,) = g.node("Mul", [gate, sig], [f"l{i}.silu"])
    (product,) = g.node("Mul", [silu, up], [f"l{i}.gated"])
    return g.linear(f"l{i}.down", product, mlp.down_proj.weight, None)


def _skip_norm(g: _Graph, name: str, inputs: tuple[str, str], weight: torch.Tensor, eps: float):
    """RMSNorm(x + skip) and x + skip, in one op; `inputs` = (x, skip)."""
    gamma = g.weight(f"{name}.weight", _plain(weight).numpy())
    normed, _, _, summed = g.node(
        "SkipSimplifiedLayerNormalization",
        [*inputs, gamma],
        [f"{name}.out", f"{name}.mean", f"{name}.inv_std", f"{name}.sum"],
        domain=MS_DOMAIN,
        epsilon=eps,
    )
    return normed, summed


def _layer(g: _Graph, config: Qwen2Config, layer: Qwen2DecoderLayer, i: int, x: tuple[str, str]):
    """One decoder layer on x = (this layer's input before its residual add, the residual):
    -> (the MLP's output, the residual it adds to), the next layer's x."""
    eps = config.rms_norm_eps
    if i == 0:  # x = (embeds, ""): nothing to add yet
        gamma = g.weight("l0.input_norm.weight", _plain(layer.input_layernorm.weight).numpy())
        (normed,) = g.node(
            "SimplifiedLayerNormalization", [x[0], gamma], ["l0.input_norm"], axis=-1, epsilon=eps
        )
        residual = x[0]
    else:
        normed, residual = _skip_norm(g, f"l{i}.input_norm", x, layer.input_layernorm.weight, eps)
    attn_out = _attention(g, config, layer, i, normed)
    normed, residual = _skip_norm(
        g, f"l{i}.post_norm", (attn_out, residual), layer.post_attention_layernorm.weight, eps
    )
    return _mlp(g, config, layer, i, normed), residual


def _body(g: _Graph, model: Qwen2LM) -> str:
    """All layers, the final norm on the last position, the head and log-softmax -> logp."""
    config = model.config.backbone
    x = ("embeds", "")
    for i, layer in enumerate(model.backbone.layers):
        if not isinstance(layer, Qwen2DecoderLayer):
            raise TypeError(f"layer {i}: expected a Qwen2DecoderLayer")
        x = _layer(g, config, layer, i, x)
    (summed,) = g.node("Add", list(x), ["final_sum"])
    bounds = [
        g.weight(name, np.array([value], dtype=np.int64))
        for name, value in (("last_start", -1), ("last_end", 2**62), ("time_axis", 1))
    ]
    (last,) = g.node("Slice", [summed, *bounds], ["last_position"])
    gamma = g.weight("final_norm.weight", _plain(model.backbone.norm.weight).numpy())
    (normed,) = g.node(
        "SimplifiedLayerNormalization",
        [last, gamma],
        ["final_norm"],
        axis=-1,
        epsilon=config.rms_norm_eps,
    )
    decoder = model.llm_decoder
    head = g.linear if g.scheme.head_int8 else g.dense
    logits = head("head", normed, decoder.weight, decoder.bias)
    return g.node("LogSoftmax", [logits], ["logp"], axis=-1)[0]


def _value(name: str, elem: int, shape: list[str | int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def build_step_graph(model: Qwen2LM, scheme: QuantScheme = DEFAULT_SCHEME) -> onnx.ModelProto:
    """The int8-weight step graph of `model`'s weights (any dtype; read as float32)."""
    config = model.config.backbone
    g = _Graph(scheme)
    cos, sin = _rotary_tables(config)
    g.weight("cos", cos)
    g.weight("sin", sin)
    _body(g, model)
    kv_shape: list[str | int] = ["batch", config.num_kv_heads, "capacity", config.head_dim]
    names = GraphNames(config.num_layers)
    inputs = [
        _value("embeds", TensorProto.FLOAT, ["batch", "new", config.hidden_size]),
        _value("seqlens_k", TensorProto.INT32, ["batch"]),
        _value("total_sequence_length", TensorProto.INT32, []),
    ]
    outputs = [_value("logp", TensorProto.FLOAT, ["batch", 1, model.config.decoder_size])]
    for past, present in zip(names.past(), names.present(), strict=True):
        inputs += [_value(n, TensorProto.FLOAT, kv_shape) for n in past]
        outputs += [_value(n, TensorProto.FLOAT, kv_shape) for n in present]
    graph = helper.make_graph(g.nodes, "cosyq_llm_step", inputs, outputs, g.initializers)
    opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(MS_DOMAIN, 1)]
    return helper.make_model(graph, opset_imports=opsets, producer_name="cosyq")
