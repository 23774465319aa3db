"""Convert our flow and HiFT modules to Core ML packages (`cosyq-worker convert`).

CosyVoice 2's and 3's stages convert alike: `graphs` picks each family's graphs, and the
packages have the same names, inputs and outputs.

Each graph of `graphs` is traced with `torch.jit.trace` at one length and checked at a second
length (a trace that baked a length in fails here, not on a Mac), then converted to an ML
program. Lengths are flexible (`RangeDim`) by default; with `flow_buckets` the CFM package takes
those enumerated frame counts instead (the Neural Engine runs only fixed or enumerated shapes)
and the runtime pads to the next bucket with mask 0, which leaves the real frames unchanged
because every convolution of the estimator is causal and the mask removes padded keys from
attention. The encoder (full attention, no padding mask) and HiFT (non-causal convolutions) would
change near a padded end, so they stay flexible.

With `batch_sizes` beyond (1,) every package gets a rows axis B (a RangeDim up to the largest
size, or enumerated with the CFM's buckets; the manifest records the sizes the runtime may use)
and the encoder takes each row's token count, so padded rows come out as they would alone.

Input/output tensors stay float32 at the package boundary whatever the compute precision.
Conversion needs no Mac; running the packages does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from workers.coreml.convert.compat import (
    float_remainder_fixed,
    fp16_precision,
    known_warnings_silenced,
)
from workers.coreml.convert.compat import load_coremltools as _ct
from workers.coreml.convert.graphs import flow_graphs, hift_graphs
from workers.coreml.convert.options import ConvertOptions
from workers.coreml.manifest import DimRange
from workers.coreml.stages import (
    BATCH,
    FLOW_CFM,
    FLOW_ENCODER,
    HIFT_DECODE,
    HIFT_SOURCE,
    MIN_FRAMES,
    MIN_TOKENS,
    StageSpec,
    stage_specs,
)
from workers.model.causal_hift.model import CausalHiFTGenerator
from workers.model.dit.model import CausalMaskedDiffWithDiT
from workers.model.flow.config import NOISE_FRAMES
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.model.hift.model import HiFTGenerator

AnyFlow = CausalMaskedDiffWithXvec | CausalMaskedDiffWithDiT  # CosyVoice 2's or 3's
AnyHiFT = HiFTGenerator | CausalHiFTGenerator

TRACE_TOKENS = 20  # example length the graphs are traced at ...
CHECK_TOKENS = 27  # ... and a second length the trace must reproduce (catches baked-in sizes)
TRACE_ROWS = 2  # rows of a batched graph's example (checked at 1 row)


@dataclass
class ConvertedStage:
    """One converted (not yet compressed or saved) package and how it was made."""

    spec: StageSpec
    model: Any  # coremltools MLModel
    precision: str
    dims: dict[str, DimRange] = field(default_factory=dict)
    buckets: tuple[int, ...] = ()
    compression: str = "none"
    batch_sizes: tuple[int, ...] = (1,)


def _rows(options: ConvertOptions) -> tuple[dict[str, int], dict[str, int], dict[str, DimRange]]:
    """Axis B's example and check sizes and its range (nothing for an unbatched conversion)."""
    if not options.batched:
        return {}, {}, {}
    return {BATCH: TRACE_ROWS}, {BATCH: 1}, {BATCH: DimRange(1, options.batch_sizes[-1])}


def convert_flow(flow: AnyFlow, options: ConvertOptions) -> dict[str, ConvertedStage]:
    """The flow encoder and CFM packages (flexible N and T, or enumerated T buckets)."""
    return {FLOW_ENCODER: convert_encoder(flow, options), FLOW_CFM: convert_cfm(flow, options)}


def convert_encoder(flow: AnyFlow, options: ConvertOptions) -> ConvertedStage:
    """Tokens (1, N) + speaker embedding -> mu, speaker vector; N from 1 to noise_frames / 2."""
    cfg = flow.config
    batched = options.batched
    spec = stage_specs(cfg.mel_bins, cfg.spk_embed_dim, harmonics=1, batched=batched)
    traced, checked, rows = _rows(options)
    return _convert(
        flow_graphs(flow, batched=batched).encoder,
        spec[FLOW_ENCODER],
        example=_examples(spec[FLOW_ENCODER], {"N": TRACE_TOKENS, **traced}, cfg.vocab_size),
        check=_examples(spec[FLOW_ENCODER], {"N": CHECK_TOKENS, **checked}, cfg.vocab_size),
        dims={**rows, "N": DimRange(MIN_TOKENS, cfg.cfm.noise_frames // cfg.token_mel_ratio)},
        options=options,
    )


def convert_cfm(flow: AnyFlow, options: ConvertOptions) -> ConvertedStage:
    """The Euler/CFG loop; T flexible up to the noise buffer, or `options.flow_buckets`."""
    cfg = flow.config
    spec = stage_specs(cfg.mel_bins, cfg.spk_embed_dim, harmonics=1, batched=options.batched)
    traced, _, rows = _rows(options)
    max_frames = cfg.cfm.noise_frames
    if options.flow_buckets and options.flow_buckets[-1] > max_frames:
        raise ValueError(
            f"--flow-buckets: {options.flow_buckets[-1]} frames > the noise buffer's {max_frames}"
        )
    frames = {} if options.flow_buckets else {"T": DimRange(MIN_FRAMES, max_frames)}
    return _convert(
        flow_graphs(flow).cfm,
        spec[FLOW_CFM],
        example=_cfm_examples(
            cfg.mel_bins, cfg.token_mel_ratio * TRACE_TOKENS, traced.get(BATCH, 1)
        ),
        check=_cfm_examples(cfg.mel_bins, cfg.token_mel_ratio * CHECK_TOKENS, 1),
        dims={**rows, **frames},
        buckets=options.flow_buckets,
        options=options,
    )


def convert_hift(
    hift: AnyHiFT, options: ConvertOptions, *, max_frames: int = NOISE_FRAMES
) -> dict[str, ConvertedStage]:
    """HiFT's source (float32) and decode packages, flexible in T and L = 480·T.

    `max_frames` bounds T: the flow's noise buffer bounds an utterance (300 s of 50 Hz frames).
    """
    cfg = hift.config.base if isinstance(hift, CausalHiFTGenerator) else hift.config
    batched = options.batched
    specs = stage_specs(cfg.in_channels, 1, harmonics=hift.m_source.harmonics, batched=batched)
    graphs = hift_graphs(hift)
    per_frame = cfg.samples_per_frame
    traced, checked, rows = _rows(options)
    dims = {
        **rows,
        "T": DimRange(MIN_FRAMES, max_frames),
        "L": DimRange(per_frame * MIN_FRAMES, per_frame * max_frames),
    }
    sizes = {"T": 2 * TRACE_TOKENS, "L": 2 * TRACE_TOKENS * per_frame, **traced}
    check = {"T": 2 * CHECK_TOKENS, "L": 2 * CHECK_TOKENS * per_frame, **checked}
    return {
        name: _convert(
            graph,
            specs[name],
            example=_examples(specs[name], sizes),
            check=_examples(specs[name], check),
            dims=dims,
            options=options,
        )
        for name, graph in ((HIFT_SOURCE, graphs.source), (HIFT_DECODE, graphs.decode))
    }


def _examples(
    spec: StageSpec, sizes: Mapping[str, int], vocab: int = 0
) -> tuple[torch.Tensor, ...]:
    """Random example inputs of `spec` with its symbols set to `sizes` (fixed seed)."""
    generator = torch.Generator().manual_seed(0)
    tensors = []
    for tensor in spec.inputs:
        shape = tuple(sizes[d] if isinstance(d, str) else d for d in tensor.shape)
        if tensor.name == "lengths":  # real tokens per row: the first full, the others shorter
            full = sizes["N"]
            tensors.append(torch.tensor([max(full - 3 * b, 1) for b in range(shape[0])]).int())
        elif tensor.dtype == "int32":
            tensors.append(torch.randint(0, vocab, shape, generator=generator, dtype=torch.int32))
        else:
            tensors.append(torch.randn(shape, generator=generator))
    return tuple(tensors)


def _cfm_examples(mel_bins: int, frames: int, rows: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    parts = torch.randn(rows, 3 * mel_bins, frames, generator=generator)
    packed = torch.cat([parts, torch.ones(rows, 1, frames)], dim=1)
    return packed, torch.randn(rows, mel_bins, generator=generator)


def trace(
    graph: nn.Module, example: tuple[torch.Tensor, ...], check: tuple[torch.Tensor, ...]
) -> torch.jit.ScriptModule:
    """Trace `graph` at `example`; raise ValueError unless the trace reproduces eager at `check`.

    A length baked into the trace as a constant would pass at `example` and fail at `check`.
    """
    torch.backends.mha.set_fastpath_enabled(False)  # fused MHA fast path does not convert
    graph.eval()
    with torch.no_grad(), known_warnings_silenced():
        traced = torch.jit.trace(graph, example, check_trace=False)
        expected = _as_tuple(graph(*check))
        try:
            replayed = _as_tuple(traced(*check))
        except RuntimeError as e:
            raise ValueError(
                f"{type(graph).__name__}: the trace fails at another length ({e}); "
                "a size became a constant"
            ) from e
    for got, want in zip(replayed, expected, strict=True):
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            raise ValueError(
                f"{type(graph).__name__}: the trace does not generalise to other lengths "
                f"(shape {tuple(got.shape)} vs {tuple(want.shape)}); a size became a constant"
            )
    return traced


def _as_tuple(x: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return x if isinstance(x, tuple) else (x,)


def _convert(
    graph: nn.Module,
    spec: StageSpec,
    *,
    example: tuple[torch.Tensor, ...],
    check: tuple[torch.Tensor, ...],
    dims: Mapping[str, DimRange],
    buckets: tuple[int, ...] = (),
    options: ConvertOptions,
) -> ConvertedStage:
    ct = _ct()
    precision = options.stage_precision(spec.name)
    sizes = options.batch_sizes if options.batched else (1,)
    traced = trace(graph, example, check)
    with known_warnings_silenced(), float_remainder_fixed():
        model = ct.convert(
            traced,
            inputs=_input_types(ct, spec, example, dims, buckets, batch_sizes=sizes),
            outputs=[ct.TensorType(name=t.name, dtype=np.float32) for t in spec.outputs],
            convert_to="mlprogram",
            minimum_deployment_target=getattr(ct.target, options.target),
            compute_precision=fp16_precision(ct) if precision == "fp16" else ct.precision.FLOAT32,
        )
    return ConvertedStage(spec, model, precision, dict(dims), buckets, batch_sizes=sizes)


def _input_types(
    ct: Any,
    spec: StageSpec,
    example: tuple[torch.Tensor, ...],
    dims: Mapping[str, DimRange],
    buckets: tuple[int, ...],
    *,
    batch_sizes: tuple[int, ...] = (1,),
) -> list[Any]:
    """ct.TensorType per input: RangeDim for flexible symbols, EnumeratedShapes for buckets
    (every batch size times every bucket for the input with T; macOS 14 allows one such input,
    so a batched `spks` keeps a RangeDim B).

    A RangeDim's default (the shape a Mac specialises for first) is the traced example's
    length, and one row for B.
    """
    traced = {
        d: int(x.shape[i]) for t, x in zip(spec.inputs, example, strict=True)
        for i, d in enumerate(t.shape) if isinstance(d, str)
    }  # fmt: skip
    traced[BATCH] = batch_sizes[0]
    ranges = {
        symbol: ct.RangeDim(lower_bound=r.lower, upper_bound=r.upper, default=traced[symbol])
        for symbol, r in dims.items()
    }
    types = []
    for tensor in spec.inputs:
        dtype = np.int32 if tensor.dtype == "int32" else np.float32
        if buckets and "T" in tensor.symbols:
            shapes = [
                tuple({"T": frames, BATCH: rows}.get(d, d) if isinstance(d, str) else d
                      for d in tensor.shape)
                for rows in (batch_sizes if BATCH in tensor.symbols else (1,))
                for frames in buckets
            ]  # fmt: skip
            shape: Any = ct.EnumeratedShapes(shapes=shapes, default=shapes[0])
        else:
            shape = tuple(ranges[d] if isinstance(d, str) else d for d in tensor.shape)
        types.append(ct.TensorType(name=tensor.name, shape=shape, dtype=dtype))
    return types
