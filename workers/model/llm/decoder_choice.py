"""Which batched decode a model gets: the dynamic step on the CPU, the static-cache step on CUDA
(one captured graph per batch bucket, optionally `torch.compile`d), as the kernel policy says;
the int8 ONNX Runtime step its own (`ort_batch`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from workers.model.kernel_policy import kernel_policy
from workers.model.llm.batch import BatchDecoder, RowBatch
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


def open_row_decoder(
    model: object, rows: int, positions: int, *, choice: DecodeChoice | None = None
) -> RowBatch | None:
    """The batched decoder for a pipeline's LLM: `open_decoder` for our torch `Qwen2LM`, the
    int8 ORT step's `OrtBatchDecoder`, None for an LLM with no batched decode (a Core ML
    LLM keeps its own batch-1 state)."""
    if isinstance(model, Qwen2LM):
        return open_decoder(model, rows, positions, choice=choice)
    # an OrtSpeechLM exists only once its module is loaded: no onnx import for other LLMs
    if "workers.model.llm.ort_decoder" in sys.modules:
        from workers.model.llm.ort_batch import OrtBatchDecoder  # noqa: PLC0415
        from workers.model.llm.ort_decoder import OrtSpeechLM  # noqa: PLC0415

        if isinstance(model, OrtSpeechLM):
            return OrtBatchDecoder(model, rows, positions)
    return None
