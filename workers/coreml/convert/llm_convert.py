"""Convert the LLM to one stateful multifunction package (`llm.mlpackage`, macOS 15 only).

`StatefulLLMGraph` is traced once and converted twice: `prefill` (T new positions, flexible)
and `decode` (one position, fixed shape). Both keep the KV cache in the same two states, get the
same weight compression, and are merged by `save_multifunction`, which stores each weight once.
A runtime makes one state per request and calls prefill, then decode per token, with it.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from workers.coreml.convert.compat import (
    fp16_precision,
    known_warnings_silenced,
    load_coremltools,
    release_temp_package,
)
from workers.coreml.convert.compress import compress_model
from workers.coreml.convert.llm_graph import (
    StatefulLLMGraph,
    causal_mask,
)
from workers.coreml.convert.options import ConvertOptions
from workers.coreml.convert.stages_convert import trace
from workers.coreml.manifest import DimRange
from workers.coreml.stages import LLM_DECODE, LLM_STATES, TensorSpec, llm_specs
from workers.model.llm.model import Qwen2LM

TRACE_POSITIONS = 8  # traced as a prefill of 8 positions ...
CHECK_START, CHECK_POSITIONS = 3, 5  # ... checked as 5 positions after 3 cached ones


@dataclass(frozen=True)
class ConvertedLLM:
    """The saved multifunction package and how it was made."""

    path: Path
    precision: str
    compression: str
    capacity: int  # KV-cache positions: prompt + generated tokens of one request
    states: tuple[TensorSpec, ...]
    dims: dict[str, DimRange]


def convert_llm(
    llm: Qwen2LM, options: ConvertOptions, destination: Path, *, capacity: int
) -> ConvertedLLM:
    """Write `destination` (an .mlpackage) with the functions `prefill` and `decode`."""
    if options.target != "macOS15":
        raise ValueError("the stateful LLM needs --target macOS15 (Core ML states are iOS 18+)")
    ct = load_coremltools()
    graph = StatefulLLMGraph(llm, capacity)
    hidden = llm.config.backbone.hidden_size
    g = torch.Generator().manual_seed(0)
    example = (
        torch.randn(1, TRACE_POSITIONS, hidden, generator=g),
        causal_mask(0, TRACE_POSITIONS),
    )
    check = (
        torch.randn(1, CHECK_POSITIONS, hidden, generator=g),
        causal_mask(CHECK_START, CHECK_POSITIONS),
    )
    traced = trace(graph, example, check)
    # Core ML states are fp16 only, whatever the compute precision.
    states = tuple(TensorSpec(n, "float16", tuple(graph.k_cache.shape)) for n in LLM_STATES)
    dims = {"T": DimRange(1, capacity), "E": DimRange(1, capacity)}
    with tempfile.TemporaryDirectory(prefix="cosyq-llm-") as tmp:
        desc = ct.utils.MultiFunctionDescriptor()
        for function, spec in llm_specs(hidden, llm.config.decoder_size).items():
            model = _convert_function(
                ct, traced, spec.inputs, dims=dims, states=states, options=options
            )
            compressed = compress_model(model, options.weights, options.target)
            path = Path(tmp) / f"{function}.mlpackage"
            with known_warnings_silenced():
                compressed.save(str(path))
            for item in {id(model): model, id(compressed): compressed}.values():
                release_temp_package(item)
            desc.add_function(str(path), src_function_name="main", target_function_name=function)
        desc.default_function_name = LLM_DECODE
        with known_warnings_silenced():
            ct.utils.save_multifunction(desc, str(destination))
    return ConvertedLLM(destination, options.precision, options.weights, capacity, states, dims)


def _convert_function(
    ct: Any,
    traced: torch.jit.ScriptModule,
    inputs: tuple[TensorSpec, ...],
    *,
    dims: dict[str, DimRange],
    states: tuple[TensorSpec, ...],
    options: ConvertOptions,
) -> Any:
    ranges = {s: ct.RangeDim(lower_bound=r.lower, upper_bound=r.upper, default=r.lower + 7)
              for s, r in dims.items()}  # fmt: skip
    types = [
        ct.TensorType(
            name=t.name,
            shape=tuple(ranges[d] if isinstance(d, str) else d for d in t.shape),
            dtype=np.float32,
        )
        for t in inputs
    ]
    state_types = [
        ct.StateType(
            wrapped_type=ct.TensorType(shape=s.shape, dtype=np.dtype(s.dtype).type), name=s.name
        )
        for s in states
    ]
    with known_warnings_silenced():
        return ct.convert(
            traced,
            inputs=types,
            outputs=[ct.TensorType(name="logits", dtype=np.float32)],
            states=state_types,
            convert_to="mlprogram",
            minimum_deployment_target=ct.target.macOS15,
            compute_precision=(
                fp16_precision(ct) if options.precision == "fp16" else ct.precision.FLOAT32
            ),
        )
