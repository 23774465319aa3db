"""Run a converted Core ML program on Linux: a small PyTorch interpreter of its MIL ops.

Linux has no Core ML runtime, so without this the converted programs are only inspected, never
run, and a converter bug (coremltools once turned HiFT's `x % 1` into `x - x`) stays hidden
until a Mac runs the package. `MILPredictor` reads a saved package's program and evaluates it op
by op for the ops our packages use, following the MIL op definitions; values of fp16 ops are
rounded to fp16 after each op (fp16 storage; the arithmetic itself runs in float32). It
implements the runtime's `Predictor` / `StatefulPredictor` protocols, so `CoreMLFlow`,
`CoreMLHiFT` and `CoreMLQwen2LM` run on the converted programs themselves.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from workers.coreml.convert.compat import load_coremltools
from workers.coreml.convert.compress import load_mil_program

Args = dict[str, Any]
OPS: dict[str, Callable[[Args, Any], Tensor]] = {}


def op(*names: str) -> Callable[[Callable[[Args, Any], Tensor]], Callable[[Args, Any], Tensor]]:
    def register(fn: Callable[[Args, Any], Tensor]) -> Callable[[Args, Any], Tensor]:
        for name in names:
            OPS[name] = fn
        return fn

    return register


def _ints(value: Any) -> list[int]:
    return [int(v) for v in np.asarray(value).reshape(-1)]


for _name, _fn in {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "real_div": torch.div,
    "maximum": torch.maximum, "pow": torch.pow, "equal": torch.eq, "greater": torch.gt,
    "greater_equal": torch.ge, "less": torch.lt, "logical_and": torch.logical_and,
    "logical_or": torch.logical_or,
}.items():  # fmt: skip
    OPS[_name] = lambda a, _, f=_fn: f(torch.as_tensor(a["x"]), torch.as_tensor(a["y"]))
for _name, _fn in {
    "abs": torch.abs, "cos": torch.cos, "sin": torch.sin, "exp": torch.exp, "floor": torch.floor,
    "tanh": torch.tanh, "silu": F.silu, "softplus": F.softplus, "sqrt": torch.sqrt,
    "logical_not": torch.logical_not,
}.items():  # fmt: skip
    OPS[_name] = lambda a, _, f=_fn: f(a["x"])


@op("const")
def _const(a: Args, node: Any) -> Tensor:
    return _tensor(node.outputs[0].val)


@op("cast")
def _cast(a: Args, _: Any) -> Tensor:
    dtype = str(a["dtype"])
    if dtype == "bool":
        return a["x"].bool()
    if dtype.startswith(("int", "uint")):
        return a["x"].to(torch.int64)
    return a["x"].to(torch.float32)  # fp16 values are rounded after the op


@op("linear")
def _linear(a: Args, _: Any) -> Tensor:
    return F.linear(a["x"], a["weight"], a.get("bias"))


@op("matmul")
def _matmul(a: Args, _: Any) -> Tensor:
    x = a["x"].transpose(-1, -2) if a.get("transpose_x", False) else a["x"]
    y = a["y"].transpose(-1, -2) if a.get("transpose_y", False) else a["y"]
    return torch.matmul(x, y)


def _conv_padding(a: Args, kernel: list[int], dilations: list[int]) -> list[int]:
    pad_type = a.get("pad_type", "valid")
    if pad_type == "custom":
        return _ints(a["pad"])
    if pad_type == "valid":
        return [0] * (2 * len(kernel))
    raise NotImplementedError(f"conv pad_type {pad_type}")


@op("conv")
def _conv(a: Args, _: Any) -> Tensor:
    x, w = a["x"], a["weight"]
    spatial = w.dim() - 2
    strides = _ints(a.get("strides", [1] * spatial))
    dilations = _ints(a.get("dilations", [1] * spatial))
    pads = _conv_padding(a, list(w.shape[2:]), dilations)
    flat = [p for i in reversed(range(spatial)) for p in (pads[2 * i], pads[2 * i + 1])]
    conv = (F.conv1d, F.conv2d, F.conv3d)[spatial - 1]
    groups = int(a.get("groups", 1))
    return conv(F.pad(x, flat), w, a.get("bias"), strides, 0, dilations, groups)


@op("conv_transpose")
def _conv_transpose(a: Args, _: Any) -> Tensor:
    x, w = a["x"], a["weight"]
    if w.dim() != 3:
        raise NotImplementedError("conv_transpose: 1-D only")
    stride = _ints(a.get("strides", [1]))[0]
    dilation = _ints(a.get("dilations", [1]))[0]
    out = F.conv_transpose1d(x, w, a.get("bias"), stride, 0, 0, int(a.get("groups", 1)), dilation)
    begin, end = _ints(a["pad"]) if a.get("pad_type", "valid") == "custom" else (0, 0)
    return out[..., begin : out.shape[-1] - end]


@op("pad")
def _pad(a: Args, _: Any) -> Tensor:
    x, pads = a["x"], _ints(a["pad"])
    dims = len(pads) // 2
    flat = [p for i in reversed(range(dims)) for p in (pads[2 * i], pads[2 * i + 1])]
    while flat and flat[-2:] == [0, 0]:
        flat = flat[:-2]  # torch pads only the trailing dims it is given
    mode = a.get("mode", "constant")
    if mode == "constant":
        return F.pad(x, flat, value=float(a.get("constant_val", 0.0)))
    batched = x.dim() <= len(flat) // 2 + 1
    y = F.pad(x.unsqueeze(0) if batched else x, flat, mode=mode)
    return y.squeeze(0) if batched else y


@op("layer_norm")
def _layer_norm(a: Args, _: Any) -> Tensor:
    x, axes = a["x"], _ints(a["axes"])
    mean = x.mean(dim=axes, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=axes, keepdim=True)
    y = (x - mean) / torch.sqrt(var + float(a["epsilon"]))
    return y * a["gamma"] + a["beta"] if "gamma" in a else y


@op("softmax")
def _softmax(a: Args, _: Any) -> Tensor:
    return torch.softmax(a["x"], dim=int(a["axis"]))


@op("gelu")
def _gelu(a: Args, _: Any) -> Tensor:
    return F.gelu(a["x"], approximate="none" if a.get("mode", "EXACT") == "EXACT" else "tanh")


@op("elu")
def _elu(a: Args, _: Any) -> Tensor:
    return F.elu(a["x"], float(a.get("alpha", 1.0)))


@op("leaky_relu")
def _leaky_relu(a: Args, _: Any) -> Tensor:
    return F.leaky_relu(a["x"], float(a.get("alpha", 0.01)))


@op("clip")
def _clip(a: Args, _: Any) -> Tensor:
    return a["x"].clamp(float(a["alpha"]), float(a["beta"]))


@op("rsqrt")
def _rsqrt(a: Args, _: Any) -> Tensor:
    return torch.rsqrt(a["x"] + float(a.get("epsilon", 1e-12)))


@op("select")
def _select(a: Args, _: Any) -> Tensor:
    return torch.where(a["cond"].bool(), a["a"], a["b"])


@op("fill_like")
def _fill_like(a: Args, _: Any) -> Tensor:
    return torch.full_like(a["ref_tensor"], float(a.get("value", 0.0)), dtype=torch.float32)


@op("shape")
def _shape(a: Args, _: Any) -> Tensor:
    return torch.tensor(list(a["x"].shape), dtype=torch.int64)


@op("range_1d")
def _range_1d(a: Args, _: Any) -> Tensor:
    values = [a[k].item() if isinstance(a[k], Tensor) else a[k] for k in ("start", "end", "step")]
    return torch.arange(*values)


@op("cumsum")
def _cumsum(a: Args, _: Any) -> Tensor:
    x, axis = a["x"], int(a.get("axis", 0))
    if a.get("reverse", False):
        x = x.flip(axis)
    y = torch.cumsum(x, dim=axis)
    if a.get("exclusive", False):
        y = y - x
    return y.flip(axis) if a.get("reverse", False) else y


@op("reduce_mean", "reduce_l2_norm")
def _reduce(a: Args, node: Any) -> Tensor:
    axes, keep = _ints(a["axes"]), bool(a.get("keep_dims", False))
    if node.op_type == "reduce_mean":
        return a["x"].mean(dim=axes, keepdim=keep)
    return torch.sqrt((a["x"] ** 2).sum(dim=axes, keepdim=keep))


@op("reshape")
def _reshape(a: Args, _: Any) -> Tensor:
    return a["x"].reshape(_ints(a["shape"]))


@op("transpose")
def _transpose(a: Args, _: Any) -> Tensor:
    return a["x"].permute(_ints(a["perm"]))


@op("expand_dims")
def _expand_dims(a: Args, _: Any) -> Tensor:
    x = a["x"]
    rank = x.dim() + len(_ints(a["axes"]))
    for axis in sorted(ax % rank for ax in _ints(a["axes"])):
        x = x.unsqueeze(axis)
    return x


@op("squeeze")
def _squeeze(a: Args, _: Any) -> Tensor:
    if "axes" not in a:
        return a["x"].squeeze()
    return a["x"].squeeze(tuple(_ints(a["axes"])))


@op("tile")
def _tile(a: Args, _: Any) -> Tensor:
    return a["x"].repeat(_ints(a["reps"]))


@op("concat")
def _concat(a: Args, _: Any) -> Tensor:
    if a.get("interleave", False):
        raise NotImplementedError("concat interleave")
    return torch.cat([torch.atleast_1d(torch.as_tensor(v)) for v in a["values"]], int(a["axis"]))


@op("stack")
def _stack(a: Args, _: Any) -> Tensor:
    return torch.stack([torch.as_tensor(v) for v in a["values"]], dim=int(a["axis"]))


@op("gather")
def _gather(a: Args, _: Any) -> Tensor:
    if int(a.get("batch_dims", 0)):
        raise NotImplementedError("gather batch_dims")
    x, indices, axis = a["x"], torch.as_tensor(a["indices"]).long(), int(a.get("axis", 0))
    indices = torch.where(indices < 0, indices + x.shape[axis], indices)
    out = torch.index_select(x, axis, indices.reshape(-1))
    shape = [*x.shape[:axis], *indices.shape, *x.shape[axis + 1 :]]
    return out.reshape(shape)


def _slices(a: Args, shape: torch.Size) -> list[slice]:
    rank = len(shape)
    begin, end = _ints(a["begin"]), _ints(a["end"])
    stride = _ints(a["stride"]) if "stride" in a else [1] * rank
    begin_mask = [bool(b) for b in np.asarray(a.get("begin_mask", [False] * rank)).reshape(-1)]
    end_mask = [bool(b) for b in np.asarray(a.get("end_mask", [False] * rank)).reshape(-1)]
    return [
        slice(None if begin_mask[i] else begin[i], None if end_mask[i] else end[i], stride[i])
        for i in range(rank)
    ]


@op("split")
def _split(a: Args, _: Any) -> tuple[Tensor, ...]:
    """Several outputs (a tuple): `split_sizes` along `axis`, or `num_splits` equal parts."""
    x, axis = a["x"], int(a["axis"])
    if a.get("split_sizes") is not None:
        sizes = _ints(a["split_sizes"])
    else:
        parts = int(a["num_splits"])
        sizes = [x.shape[axis] // parts] * parts
    return tuple(torch.split(x, sizes, dim=axis))


@op("slice_by_index")
def _slice_by_index(a: Args, _: Any) -> Tensor:
    x = a["x"]
    y = x[tuple(_slices(a, x.shape))]
    squeeze = [bool(b) for b in np.asarray(a.get("squeeze_mask", [False] * x.dim())).reshape(-1)]
    return y.squeeze(tuple(i for i, s in enumerate(squeeze) if s)) if any(squeeze) else y


@op("slice_update")
def _slice_update(a: Args, _: Any) -> Tensor:
    x = a["x"].clone()
    index = tuple(_slices(a, x.shape))
    x[index] = a["update"].reshape(x[index].shape)
    return x


@op("upsample_nearest_neighbor")
def _upsample_nearest(a: Args, _: Any) -> Tensor:
    scale = (float(a["scale_factor_height"]), float(a["scale_factor_width"]))
    return F.interpolate(a["x"], scale_factor=scale, mode="nearest")


@op("upsample_bilinear")
def _upsample_bilinear(a: Args, _: Any) -> Tensor:
    scale = (float(a["scale_factor_height"]), float(a["scale_factor_width"]))
    corners = bool(a.get("align_corners", False))
    return F.interpolate(a["x"], scale_factor=scale, mode="bilinear", align_corners=corners)


@op("scaled_dot_product_attention")
def _sdpa(a: Args, _: Any) -> Tensor:
    mask = a.get("attn_mask")
    return F.scaled_dot_product_attention(a["query"], a["key"], a["value"], attn_mask=mask)


def _tensor(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return torch.from_numpy(
            np.array(value, dtype=np.float32 if value.dtype.kind == "f" else value.dtype)
        )
    if isinstance(value, np.generic):
        return value.item()
    return value


def load_package_program(package: Path) -> Any:
    """The MIL program of a saved package (~1 s for a batched flow encoder, most of it type
    inference: a test that runs a package several times loads it once)."""
    ct = load_coremltools()
    return load_mil_program(ct.models.MLModel(str(package), skip_model_load=True))


class PackagePrograms:
    """The MIL programs of a folder of packages (`<stage>.mlpackage`), each loaded the first
    time it is asked for; the interpreter only reads a program, so its runs may share it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._programs: dict[str, Any] = {}

    def __getitem__(self, stage: str) -> Any:
        if stage not in self._programs:
            self._programs[stage] = load_package_program(self.folder / f"{stage}.mlpackage")
        return self._programs[stage]

    def predictor(self, stage: str) -> MILPredictor:
        return MILPredictor.of_program(self[stage])


class MILPredictor:
    """`predict` (and `make_state`) of one function of a saved package, by interpretation."""

    def __init__(
        self, package: Path, function_name: str = "main", *, fp16_rounding: bool = True
    ) -> None:
        self._interpret(load_package_program(package), function_name, fp16_rounding)

    @classmethod
    def of_program(
        cls, program: Any, function_name: str = "main", *, fp16_rounding: bool = True
    ) -> MILPredictor:
        """The predictor of a program loaded already (`load_package_program`)."""
        predictor = cls.__new__(cls)
        predictor._interpret(program, function_name, fp16_rounding)
        return predictor

    def _interpret(self, program: Any, function_name: str, fp16_rounding: bool) -> None:
        self.fp16_rounding = fp16_rounding
        self.function = program.functions[function_name]
        self.types = importlib.import_module("coremltools.converters.mil.mil.types")
        self.ops = [_prepare(node) for node in self.function.operations]

    def make_state(self) -> dict[str, Tensor]:
        return {
            name: torch.zeros(tuple(var.sym_type.wrapped_type().get_shape()))
            for name, var in self.function.inputs.items()
            if self.types.is_state(var.sym_type)
        }

    @torch.no_grad()
    def predict(
        self, data: dict[str, np.ndarray], state: dict[str, Tensor] | None = None
    ) -> dict[str, np.ndarray]:
        env: dict[str, Any] = {
            name: torch.from_numpy(np.array(value)) for name, value in data.items()
        }
        env.update(state or {})
        for node, run in self.ops:
            args = {k: _lookup(env, v) for k, v in node.inputs.items()}
            result = run(args, node)
            if node.op_type == "coreml_update_state":
                env[node.inputs["state"].name] = args["value"]
                if state is not None:
                    state[node.inputs["state"].name] = args["value"]
            if node.op_type == "read_state":
                result = env[node.inputs["input"].name]
            results = result if len(node.outputs) > 1 else (result,)  # split: a tuple
            for out, value in zip(node.outputs, results, strict=True):
                fp16 = self.fp16_rounding and out.dtype == self.types.fp16
                rounded = fp16 and isinstance(value, Tensor) and value.is_floating_point()
                env[out.name] = value.half().float() if rounded else value
        return {var.name: env[var.name].numpy() for var in self.function.outputs}


def _prepare(node: Any) -> tuple[Any, Callable[[Args, Any], Any]]:
    if node.op_type.startswith("constexpr_"):
        value = _tensor(node.materialized_val_inference())
        return node, lambda _a, _n: value
    if node.op_type in ("read_state", "coreml_update_state"):
        return node, lambda a, _n: a.get("value")
    if node.op_type not in OPS:
        raise NotImplementedError(f"MIL op {node.op_type} is not interpreted")
    return node, OPS[node.op_type]


def _lookup(env: dict[str, Any], var: Any) -> Any:
    if isinstance(var, (list, tuple)):
        return [_lookup(env, v) for v in var]
    if var.name in env:
        return env[var.name]
    if var.val is not None:
        return _tensor(var.val)
    raise KeyError(f"MIL value {var.name} used before it was computed")
