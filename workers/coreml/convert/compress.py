"""Weight compression of converted packages, and reading the weights back into PyTorch.

Compression uses `coremltools.optimize.coreml` on the converted model (the blog's
`quantize_weights=` argument to `ct.convert` does not exist). Schemes:
- `int8`: linear symmetric int8, one scale per output channel (macOS 14+);
- `int8-block`: int8 with one scale per block of `INT8_BLOCK` input channels (macOS 15+);
- `palette6` / `palette4`: k-means palettization, a 64 / 16 entry lookup table per tensor.

Quality on Linux: `decompressed_weights` turns every compressed constant back into a plain
array, and `load_into` copies those arrays into our PyTorch modules by name (Core ML names each
weight after the traced module's parameter path, dots as underscores), so PyTorch can run the
compressed weights. Activations still run in float32 there; fp16 arithmetic is only measured
on a Mac.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import numpy as np
import torch
from torch import nn

from workers.coreml.convert.compat import (
    known_warnings_silenced,
    load_coremltools,
)
from workers.coreml.convert.options import check_scheme

INT8_BLOCK = 32  # input channels per int8 scale in `int8-block`
MIN_COMPRESSED_ELEMENTS = 2048  # coremltools' default: smaller tensors stay float
_NAME_SUFFIX = re.compile(r"(_to_fp16)?(_quantized|_palettized)?$")


def _config(scheme: str) -> Any:
    opt = load_coremltools().optimize.coreml
    if scheme == "int8":
        op: Any = opt.OpLinearQuantizerConfig(
            mode="linear_symmetric", dtype="int8", granularity="per_channel"
        )
    elif scheme == "int8-block":
        op = opt.OpLinearQuantizerConfig(
            mode="linear_symmetric", dtype="int8", granularity="per_block", block_size=INT8_BLOCK
        )
    else:
        op = opt.OpPalettizerConfig(mode="kmeans", nbits=int(scheme.removeprefix("palette")))
    op.weight_threshold = MIN_COMPRESSED_ELEMENTS
    return opt.OptimizationConfig(global_config=op)


def compress_model(model: Any, scheme: str, target: str) -> Any:
    """The converted MLModel with its weights compressed by `scheme` ("none": unchanged)."""
    check_scheme(scheme, target)
    if scheme == "none":
        return model
    opt = load_coremltools().optimize.coreml
    compress = opt.linear_quantize_weights if scheme.startswith("int8") else opt.palettize_weights
    with known_warnings_silenced():
        return compress(model, _config(scheme))


def load_mil_program(model: Any) -> Any:
    """The MIL program inside a saved ML program (an `MLModel`, loaded or not)."""
    milproto = importlib.import_module("coremltools.converters.mil.frontend.milproto.load")
    spec = model.get_spec()
    with known_warnings_silenced():
        return milproto.load(
            spec,
            specification_version=spec.specificationVersion,
            file_weights_dir=model.weights_dir,
        )


def decompressed_weights(model: Any) -> dict[str, np.ndarray]:
    """Every non-scalar float constant of the model as float32, by Core ML name.

    Compressed constants (`constexpr_*` ops: int8 scales, palettes) are expanded by their own
    `materialized_val_inference`, the arithmetic `decompress_weights` applies, without running
    coremltools' whole pass pipeline again (8x faster on the unrolled CFM).
    """
    return program_weights(load_mil_program(model))


def program_weights(program: Any) -> dict[str, np.ndarray]:
    """`decompressed_weights` of a MIL program already loaded (loading one is most of the
    cost: ~1 s for a batched flow encoder)."""
    weights = {}
    for function in program.functions.values():
        for op in function.operations:
            if op.op_type.startswith("constexpr_"):
                value = op.materialized_val_inference()
            elif op.op_type == "const":
                value = op.outputs[0].val
            else:
                continue
            if isinstance(value, np.ndarray) and value.size > 1 and value.dtype.kind == "f":
                weights[op.name] = value.astype(np.float32)
    return weights


def torch_name(core_ml_name: str) -> str:
    """`flow_encoder_linear_q_weight_to_fp16_quantized` -> `flow_encoder_linear_q_weight`."""
    return _NAME_SUFFIX.sub("", core_ml_name)


@torch.no_grad()
def load_into(module: nn.Module, weights: dict[str, np.ndarray]) -> set[str]:
    """Copy package weights into `module`'s parameters of the same name and element layout.

    A constant may carry singleton axes its parameter lacks (Snake's alpha (C,) is stored as
    (1, C, 1)). Returns the names of the parameters loaded; parameters the package does not
    hold under their own name (unused by its graph, or folded into other constants, like the
    time-embedding MLP of the unrolled CFM) keep their values.
    """
    by_name = {torch_name(name): value for name, value in weights.items()}
    loaded = set()
    for name, param in module.named_parameters():
        value = by_name.get(name.replace(".", "_"))
        if value is None or _squeezed(value.shape) != _squeezed(tuple(param.shape)):
            continue
        param.copy_(torch.from_numpy(value).reshape(param.shape))
        loaded.add(name)
    return loaded


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)
