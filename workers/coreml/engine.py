"""The synthesis engine with its flow, vocoder (and LLM, when converted) on Core ML.

`workers.pipeline.build_engine` takes replacement flow and vocoder stages; this module hands it
the Core ML stand-ins (`CoreMLFlow`, `CoreMLHiFT` run by the pipeline's own `ModuleFlow` and
`ModuleVocoder`) and, when the conversion has the stateful LLM, swaps the engine's speech-token
stage for one driving `CoreMLQwen2LM`. The torch parts left (front end, prompt models, the LLM
without a conversion) run on `choice.torch_device`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from shared.settings import Settings
from workers.coreml.backend import BackendChoice
from workers.coreml.loader import CoreMLStages, load_coreml_stages
from workers.pipeline import EngineOptions, SynthesisPipeline, build_engine
from workers.stages import ModuleFlow, ModuleVocoder, TorchSpeechTokens

CPU = torch.device("cpu")  # Core ML takes and returns numpy arrays on the CPU


def coreml_engine(
    settings: Settings, model_dir: Path, choice: BackendChoice, stages: CoreMLStages
) -> SynthesisPipeline:
    """Assemble the engine around loaded Core ML stages (no loading or warm-up here)."""
    engine = build_engine(
        model_dir,
        device=choice.torch_device,
        dtype=settings.dtype,
        options=EngineOptions.from_settings(settings),
        hash_cache_dir=settings.hash_cache_dir,
        flow=ModuleFlow(stages.flow, name="coreml", device=CPU),
        vocoder=ModuleVocoder(stages.hift, name="coreml", device=CPU),
        backend="coreml",
        reported_device=choice.device,
    )
    if stages.llm is not None:
        engine.llm = TorchSpeechTokens(stages.llm)  # type: ignore[arg-type]  # duck-typed Qwen2LM
    return engine


def load_coreml_engine(
    settings: Settings, model_dir: Path, choice: BackendChoice
) -> SynthesisPipeline:
    """macOS: load and warm the conversion `choice` names, then assemble the engine."""
    if choice.coreml_dir is None:
        raise ValueError("load_coreml_engine needs a Core ML BackendChoice (select_backend)")
    stages = load_coreml_stages(
        model_dir,
        coreml_dir=choice.coreml_dir,
        cache_dir=settings.coreml_cache_dir,
        compute_units=choice.compute_units,
        compile_timeout_s=settings.coreml_compile_timeout_s,
    )
    stages.warm_up()  # every CFM bucket and the LLM; the engine's own warm-up runs one request
    return coreml_engine(settings, model_dir, choice, stages)
