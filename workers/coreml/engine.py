"""The synthesis engine with its flow, vocoder (and LLM, when converted) on Core ML.

`workers.engine.pipeline.build_engine` takes replacement flow, vocoder and LLM stages; this
module loads the Core ML stand-ins (`CoreMLFlow`, `CoreMLHiFT` run by the pipeline's own
`ModuleFlow` and `ModuleVocoder`, and `CoreMLQwen2LM` behind `ModuleSpeechTokens` when the
conversion has the stateful LLM) and hands them over. A CosyVoice 3 conversion's vocoder is
`CoreMLCausalHiFT` run by `CausalVocoder`. Both families run non-streaming on Core ML: a
streamed request gets its audio piece by piece (each piece whole), as on CosyVoice 2. The
torch parts left (front end, prompt models, the LLM without a conversion) run on
`torch_device`. Plain values in: the service layer reads the settings.

A worker that runs several jobs together (`batch_size` > 1, COSYQ_BATCH_SIZE) keeps the LLM on
PyTorch even when the conversion has one: the Core ML LLM's KV cache is one fixed-shape state
per request (batch 1), while the torch LLM decodes every row of the batch in one step
(`BatchDecoder`, MPS on a Mac). The flow and HiFT stay on Core ML, batched when the conversion
has batch sizes. See docs/coreml.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from workers.coreml.causal_runtime import CoreMLCausalHiFT
from workers.coreml.loader import CoreMLStages, load_coreml_stages
from workers.engine.causal_stages import CausalVocoder
from workers.engine.pipeline import EngineOptions, SynthesisPipeline, build_engine
from workers.engine.stages import ModuleFlow, ModuleSpeechTokens, ModuleVocoder

CPU = torch.device("cpu")  # Core ML takes and returns numpy arrays on the CPU


@dataclass(frozen=True)
class CoreMLPlacement:
    """Where the engine runs under Core ML: torch stages' device and the compute units."""

    torch_device: str  # the LLM (without a conversion) and the prompt front end
    reported_device: str  # what results report, e.g. "ane/gpu/cpu"
    compute_units: str
    coreml_dir: Path


def coreml_engine(
    model_dir: Path,
    placement: CoreMLPlacement,
    stages: CoreMLStages,
    *,
    batch_size: int = 1,
    dtype: str = "fp32",
    options: EngineOptions | None = None,
    hash_cache_dir: Path | None = None,
) -> SynthesisPipeline:
    """Assemble the engine around loaded Core ML stages (no loading or warm-up here).

    `batch_size`: jobs the worker runs together; above 1 the LLM is the torch one (batched
    decoding) whether or not `stages` has a Core ML LLM.
    """
    coreml_llm = stages.llm if batch_size <= 1 else None
    vocoder: ModuleVocoder | CausalVocoder
    if isinstance(stages.hift, CoreMLCausalHiFT):  # CosyVoice 3: deterministic, one piece a call
        vocoder = CausalVocoder(stages.hift, name="coreml", device=CPU)
    else:
        vocoder = ModuleVocoder(stages.hift, name="coreml", device=CPU)
    return build_engine(
        model_dir,
        device=placement.torch_device,
        dtype=dtype,
        options=options,
        hash_cache_dir=hash_cache_dir,
        flow=ModuleFlow(stages.flow, name="coreml", device=CPU),
        vocoder=vocoder,
        llm=ModuleSpeechTokens(coreml_llm) if coreml_llm is not None else None,
        backend="coreml",
        reported_device=placement.reported_device,
    )


def load_coreml_engine(
    model_dir: Path,
    placement: CoreMLPlacement,
    *,
    cache_dir: Path,
    compile_timeout_s: float,
    batch_size: int = 1,
    dtype: str = "fp32",
    options: EngineOptions | None = None,
    hash_cache_dir: Path | None = None,
) -> SynthesisPipeline:
    """macOS: load and warm the conversion, then assemble the engine (`batch_size` > 1: the
    Core ML LLM is not even opened, see `coreml_engine`)."""
    stages = load_coreml_stages(
        model_dir,
        coreml_dir=placement.coreml_dir,
        cache_dir=cache_dir,
        compute_units=placement.compute_units,
        compile_timeout_s=compile_timeout_s,
        llm=batch_size <= 1,
        flow_steps=options.flow_steps if options is not None else None,
    )
    stages.warm_up()  # every CFM bucket, batch size and the LLM; then the engine's warm-up
    return coreml_engine(
        model_dir,
        placement,
        stages,
        batch_size=batch_size,
        dtype=dtype,
        options=options,
        hash_cache_dir=hash_cache_dir,
    )
