"""Which stage objects a loaded model directory gets, per family (what `build_engine` wires).

CosyVoice 2 and 3 share the LLM stage (`ModuleSpeechTokens` over one `Qwen2LM` class) and the
flow stage's whole-piece call (`ModuleFlow`); they part at the text tokenizer (CosyVoice 3's 280
special tokens), the vocoder (`ModuleVocoder` on HiFT with its random source, `CausalVocoder`
on the deterministic causal HiFT). The int8 LLM step serves both (the same Qwen2 body). Another
runtime's stages (Core ML) serve either family: a conversion records its family and the loader
refuses the other's (`workers.coreml.manifest.check_family`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from workers.engine.causal_stages import CausalVocoder
from workers.engine.llm_precision import int8_speech_tokens
from workers.engine.stages import ModuleSpeechTokens, ModuleVocoder, SpeechTokenStage, VocoderStage
from workers.engine.streaming import StreamSchedule
from workers.engine.voice_prefixes import VoicePrefixes
from workers.model.causal_hift.model import CausalHiFTGenerator
from workers.model.cosyvoice3_tokens import COSYVOICE3_SPECIAL_TOKENS, COSYVOICE3_USER_TOKENS
from workers.model.loader import LoadedModel
from workers.model.tokenizer import TextTokenizer, load_text_tokenizer


def voice_prefixes(schedule: StreamSchedule) -> VoicePrefixes | None:
    """The per-voice store of primed flow streams the schedule asks for (None: off)."""
    if schedule.voice_cache_max_mb <= 0:
        return None
    return VoicePrefixes(int(schedule.voice_cache_max_mb * 2**20))


def llm_stage(
    loaded: LoadedModel, llm_precision: str, ort_cache_dir: Path | None
) -> SpeechTokenStage:
    """The torch LLM stage, or with "int8" the ONNX Runtime step (cached in `ort_cache_dir`)."""
    if llm_precision != "int8":
        return ModuleSpeechTokens(loaded.llm)
    cache_dir = ort_cache_dir or Path.home() / ".cache" / "cosyq" / "onnx"
    return int8_speech_tokens(loaded, cache_dir=cache_dir, threads=torch.get_num_threads())


def family_tokenizer(folder: Path, family: str) -> TextTokenizer:
    """The family's text tokenizer: CosyVoice 3 adds its 280 special tokens ('cosyvoice3')."""
    if family == "cosyvoice3":
        return load_text_tokenizer(
            folder, specials=COSYVOICE3_SPECIAL_TOKENS, user_tokens=COSYVOICE3_USER_TOKENS
        )
    return load_text_tokenizer(folder)


def vocoder_stage(loaded: LoadedModel) -> VocoderStage:
    """The family's torch vocoder stage."""
    if isinstance(loaded.hift, CausalHiFTGenerator):
        return CausalVocoder(loaded.hift)
    return ModuleVocoder(loaded.hift)
