"""Importing coremltools, and the workarounds our conversions need with coremltools 9.0.

- `load_coremltools()`: the one place that imports it, with a clear error when it is missing or
  when numpy >= 2.4 would break conversion (coremltools#2633; see COREML.md).
- `float_remainder_fixed()`: coremltools converts torch's `x % y` to `x - floor_div(x, y) * y`,
  and its `noop_elimination` pass then deletes `floor_div(x, 1)` as if it were the identity, which
  is wrong for floats: HiFT's `increments % 1` became `x - x = 0` (all-zero sine source, found by
  reading the converted MIL). Inside this context the conversion of `remainder` uses
  `floor(real_div(x, y))`, which no pass mistakes for a no-op.
- `fp16_precision()`: FLOAT16 compute precision, except for values computed from integers
  (token ids, positions): coremltools would do `clamp(ids)` in fp16, where ids above 2048 round
  to a neighbour's embedding (found by running the converted encoder), and the sinusoidal
  position angles of the encoder and the LLM's rotary embedding in fp16, where an angle of
  1000 rad has a resolution of 0.5 rad. Those stay float32 up to the sin/cos, whose bounded
  outputs go on in fp16.
- `known_warnings_silenced()`: warnings coremltools and torch emit on every conversion, none of
  them about our graphs (torch.jit.trace deprecation, numpy casts inside coremltools' passes).
  TracerWarnings, which would mean a traced graph is wrong, are deliberately NOT silenced.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from shared.errors import ModelLoadError

NUMPY_LIMIT = (2, 4)  # numpy >= 2.4 breaks ct.convert (int() of traced shapes)


def load_coremltools() -> ModuleType:
    """Import coremltools or raise ModelLoadError saying how to install a working set."""
    major, minor = (int(part) for part in np.__version__.split(".")[:2])
    if (major, minor) >= NUMPY_LIMIT:
        raise ModelLoadError(
            f"numpy {np.__version__} breaks coremltools conversion (coremltools#2633); "
            "install numpy<2.4"
        )
    try:
        with known_warnings_silenced():
            return importlib.import_module("coremltools")
    except ImportError as e:
        raise ModelLoadError(
            f"coremltools is not installed ({e}); install the extra: pip install 'cosyq[coreml]'"
        ) from e


@contextlib.contextmanager
def known_warnings_silenced() -> Iterator[None]:
    """Ignore the conversion-time warnings listed in the module docstring, nothing else.

    coremltools' own INFO/WARNING log lines ("Tuple detected at graph output", the untested
    torch version) are held back too; its errors still show.
    """
    logger = logging.getLogger("coremltools")
    level = logger.level
    logger.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*torch\.jit\.trace.* is deprecated")
        warnings.filterwarnings("ignore", message=r"Conversion of an array with ndim > 0")
        warnings.filterwarnings("ignore", message=r"overflow encountered in cast")
        warnings.filterwarnings("ignore", message=r"Implicitly cleaning up <TemporaryDirectory")
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"coremltools\.")
        try:
            yield
        finally:
            logger.setLevel(level)


@contextlib.contextmanager
def float_remainder_fixed() -> Iterator[None]:
    """Convert torch `remainder` as x - floor(x / y) * y for the duration of the block."""
    registry = importlib.import_module(
        "coremltools.converters.mil.frontend.torch.torch_op_registry"
    )._TORCH_OPS_REGISTRY.name_to_func_mapping
    original = registry["remainder"]
    registry["remainder"] = _remainder_with_floor
    try:
        yield
    finally:
        registry["remainder"] = original


def _remainder_with_floor(context: Any, node: Any) -> None:
    mil = importlib.import_module("coremltools.converters.mil")
    torch_ops = importlib.import_module("coremltools.converters.mil.frontend.torch.ops")
    mb, types = mil.Builder, mil.mil.types
    inputs = torch_ops._get_inputs(context, node)
    dividend, divisor = torch_ops.promote_input_dtypes([inputs[0], inputs[1]])
    if types.is_int(dividend.dtype):
        quotient = mb.floor_div(x=dividend, y=divisor, name=node.name + "_div")
    else:
        ratio = mb.real_div(x=dividend, y=divisor, name=node.name + "_ratio")
        quotient = mb.floor(x=ratio, name=node.name + "_div")
    scaled = mb.mul(x=quotient, y=divisor, name=node.name + "_scaled")
    context.add(mb.sub(x=dividend, y=scaled, name=node.name))


BOUNDED_OPS = frozenset({"sin", "cos"})  # outputs in [-1, 1]: fp16 is fine from here on


def fp16_precision(ct: Any) -> Any:
    """ct.precision-compatible FLOAT16 transform that keeps integer-derived values float32."""
    return ct.transform.FP16ComputePrecision(op_selector=_fp16_allowed)


_EXACT_CACHE: dict[int, set[str]] = {}  # id(block) -> names of integer-derived float values


def _fp16_allowed(op: Any) -> bool:
    """False (stay float32) for int->float casts and ops fed by integer-derived floats."""
    types = importlib.import_module("coremltools.converters.mil.mil.types")
    if op.op_type == "cast" and types.is_int(op.x.dtype):
        return False
    exact = _exact_values(op.enclosing_block, types)
    return not any(var.name in exact for var in _input_vars(op))


def _exact_values(block: Any, types: Any) -> set[str]:
    """Float values computed from integers (positions, ids) and not yet through sin/cos.

    Only float values count: an integer index (a gather's) needs no protection, and the
    embedding rows it selects are ordinary weights. Computed once per block, in program
    order (no recursion over deep graphs).
    """
    key = id(block)
    if key not in _EXACT_CACHE:
        exact: set[str] = set()
        for op in block.operations:
            if op.op_type in BOUNDED_OPS or op.op_type == "const":
                continue
            derived = op.op_type in ("range_1d", "cast") and any(
                types.is_int(var.dtype) for var in _input_vars(op)
            )
            if derived or op.op_type == "range_1d" or any(v.name in exact for v in _input_vars(op)):
                exact.update(out.name for out in op.outputs if types.is_float(out.dtype))
        _EXACT_CACHE.clear()  # one block at a time; ids can be reused after a block is freed
        _EXACT_CACHE[key] = exact
    return _EXACT_CACHE[key]


def _input_vars(op: Any) -> list[Any]:
    found: list[Any] = []
    for value in op.inputs.values():
        found.extend(value if isinstance(value, (list, tuple)) else [value])
    return found


def release_temp_package(model: Any) -> None:
    """Delete the temporary .mlpackage coremltools keeps for a converted model until exit."""
    path = getattr(model, "package_path", None)
    if getattr(model, "is_temp_package", False) and path and Path(path).exists():
        shutil.rmtree(path, ignore_errors=True)
