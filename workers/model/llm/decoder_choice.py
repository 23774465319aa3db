"""Which batched decode a model gets: the dynamic step on the CPU, the static-cache step on CUDA
(one captured graph per batch bucket, optionally `torch.compile`d), as the kernel policy says."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workers.model.kernel_policy import kernel_policy
from workers.model.llm.batch import BatchDecoder
from workers.model.llm.model import Qwen2LM
from workers.model.llm.static_decode import DecodeStep, decode_step


@dataclass(frozen=True)
class DecodeChoice:
    """The GPU knobs (`COSYQ_CUDA_GRAPHS`, `COSYQ_COMPILE_DECODE`), as plain values."""

    cuda_graphs: bool = True
    compile_step: bool = False


def compiled_step() -> DecodeStep:
    """`decode_step` through `torch.compile`: one graph, static shapes (each bucket is its own
    specialisation); the CUDA graph around it is ours (`StaticDecoder`), not Inductor's."""
    return torch.compile(decode_step, fullgraph=True, dynamic=False)


def open_decoder(
    model: Qwen2LM, rows: int, positions: int, *, choice: DecodeChoice | None = None
) -> BatchDecoder:
    """A `BatchDecoder` for `model` as its device's policy says; on CUDA with graphs, every
    bucket is captured here, before any row is added (warm-up time, not a job's)."""
    choice = choice or DecodeChoice()
    policy = kernel_policy(model.device, model.llm_decoder.weight.dtype)
    if not policy.static_decode:
        return BatchDecoder(model, rows, positions)
    decoder = BatchDecoder(
        model,
        rows,
        positions,
        static=True,
        graphs=choice.cuda_graphs,
        step_fn=compiled_step() if choice.compile_step else None,
    )
    if decoder.static is not None:
        decoder.static.capture()
    return decoder
