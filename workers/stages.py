"""The engine's three model stages behind small protocols, with their torch implementations.

The pipeline only talks to `SpeechTokenStage`, `FlowStage` and `VocoderStage`, and their inputs
and outputs are numpy arrays on the CPU (plus the request's torch.Generator), so another runtime
(Core ML for the flow and HiFT) plugs in by implementing two small classes; nothing else in the
pipeline changes. Stage objects hold only the loaded model: all per-request state (generator,
KV cache, noise) is created per call.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from workers.engine_api import VoicePrompt
from workers.model.flow import CausalMaskedDiffWithXvec
from workers.model.hift import HiFTGenerator
from workers.model.hift_source import SourceNoise
from workers.model.llm import Qwen2LM, iter_speech_tokens


@dataclass(frozen=True)
class SpeechTokens:
    """What the LLM produced for one piece and how long it took."""

    ids: np.ndarray  # (n,) int32 speech token ids (no stop id)
    first_token_s: float  # prefill + first sampling step
    total_s: float


class SpeechTokenStage(Protocol):
    def generate(
        self,
        text: list[int],
        *,
        prompt_text: list[int],
        prompt_speech: np.ndarray,
        generator: torch.Generator,
        forced_length: int | None = None,
    ) -> SpeechTokens:
        """Text ids (+ prompt text ids and prompt speech tokens) -> speech tokens."""


class FlowStage(Protocol):
    name: str

    def mel(self, tokens: np.ndarray, prompt: VoicePrompt) -> np.ndarray:
        """tokens (n,) int32 after the prompt's -> mel (80, 2n) float32, prompt frames excluded."""


class VocoderStage(Protocol):
    name: str

    def waveform(self, mel: np.ndarray, generator: torch.Generator) -> np.ndarray:
        """mel (80, T) float32 -> (480·T,) float32 samples at 24 kHz; random source from
        `generator`."""


class TorchSpeechTokens:
    """The LLM stage in torch (it stays in torch on every backend)."""

    def __init__(self, model: Qwen2LM) -> None:
        self.model = model

    def generate(
        self,
        text: list[int],
        *,
        prompt_text: list[int],
        prompt_speech: np.ndarray,
        generator: torch.Generator,
        forced_length: int | None = None,
    ) -> SpeechTokens:
        start = time.perf_counter()
        tokens = iter_speech_tokens(
            self.model,
            text,
            prompt_text=prompt_text,
            prompt_speech=torch.from_numpy(np.asarray(prompt_speech, dtype=np.int64)),
            generator=generator,
            forced_length=forced_length,
        )
        ids: list[int] = []
        first_s = 0.0
        for token in tokens:
            if not ids:
                first_s = time.perf_counter() - start
            ids.append(token)
        total = time.perf_counter() - start
        return SpeechTokens(np.asarray(ids, dtype=np.int32), first_s or total, total)


class TorchFlow:
    """The flow stage in torch on the model's device and dtype."""

    name = "torch"

    def __init__(self, model: CausalMaskedDiffWithXvec) -> None:
        self.model = model
        self.device = next(model.parameters()).device

    @torch.inference_mode()
    def mel(self, tokens: np.ndarray, prompt: VoicePrompt) -> np.ndarray:
        device = self.device
        mel, _ = self.model.inference(
            torch.from_numpy(np.asarray(tokens, dtype=np.int32))[None].to(device),
            torch.from_numpy(prompt.speech_tokens.astype(np.int32))[None].to(device),
            torch.from_numpy(prompt.mel)[None].to(device),
            torch.from_numpy(prompt.embedding)[None].to(device),
        )
        return mel[0].float().cpu().numpy()


def source_noise(
    harmonics: int, samples: int, generator: torch.Generator, device: torch.device
) -> SourceNoise:
    """The sine source's random draws for one piece, drawn contiguously on the CPU.

    `draw_source_noise` fills in upstream's (transposed) order so a seed reproduces upstream's
    draws for the parity checks; that strided fill costs ~19 ms per 4 s of audio against ~2 ms
    here. Any fixed order is as deterministic, and the production engine needs no more.
    """
    rand_ini = torch.rand(1, harmonics, generator=generator)
    normal = torch.randn(1, harmonics, samples, generator=generator)
    return SourceNoise(rand_ini.to(device), normal.to(device))


class TorchVocoder:
    """HiFT in torch on the model's device (source and transforms in float32)."""

    name = "torch"

    def __init__(self, model: HiFTGenerator) -> None:
        self.model = model
        self.device = next(model.parameters()).device

    def waveform(self, mel: np.ndarray, generator: torch.Generator) -> np.ndarray:
        frames = mel.shape[-1]
        noise = source_noise(
            self.model.m_source.harmonics,
            frames * self.model.config.samples_per_frame,
            generator,
            self.device,
        )
        out = self.model.inference(
            torch.from_numpy(np.ascontiguousarray(mel, dtype=np.float32))[None].to(self.device),
            noise=noise,
        )
        return out.wav[0].float().cpu().numpy()
