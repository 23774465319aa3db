"""The engine's three model stages behind small protocols, and the runners it uses for them.

The pipeline only talks to `SpeechTokenStage`, `FlowStage` and `VocoderStage`, whose inputs and
outputs are numpy arrays on the CPU (plus the request's torch.Generator). `ModuleFlow` and
`ModuleVocoder` run any object with the call shape of our torch modules' `inference`
(`CausalMaskedDiffWithXvec.inference`, `HiFTGenerator.inference`): the torch modules
themselves, or the Core ML stand-ins with the same call shapes, so another runtime plugs in as
a different object, not different pipeline code. Stage objects hold only the loaded model:
all per-request state (generator, KV cache, noise) is created per call.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from workers.engine.api import StopCheck, VoicePrompt, stop_if_asked
from workers.engine.flow_chunks import (
    BoundedFlowChunks,
    CachedFlowChunks,
    RecomputedFlowChunks,
)
from workers.engine.voice_prefixes import VoicePrefixes
from workers.model.flow.batch import FlowRow, batched_inference
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.model.hift.config import HiFTConfig
from workers.model.hift.model import HiFTGenerator
from workers.model.hift.source import SourceNoise
from workers.model.llm.cosyvoice3 import cap_silent_runs
from workers.model.llm.model import DecodeOutcome, SpeechLM, StopKind, iter_speech_tokens


@dataclass(frozen=True)
class SpeechTokens:
    """What the LLM produced for one piece and how long it took."""

    ids: np.ndarray  # (n,) int32 speech token ids (no stop id)
    first_token_s: float  # prefill + first sampling step
    stop: StopKind = "unknown"  # how the LLM ended the piece (stop id, length bound, forced)


class SpeechTokenStage(Protocol):
    def generate(
        self,
        text: list[int],
        *,
        prompt_text: list[int],
        prompt_speech: np.ndarray,
        generator: torch.Generator,
        forced_length: int | None = None,
        should_stop: StopCheck | None = None,
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


class ModuleSpeechTokens:
    """The LLM stage in torch (it stays in torch on every backend)."""

    def __init__(self, model: SpeechLM) -> None:
        self.model = model

    def generate(
        self,
        text: list[int],
        *,
        prompt_text: list[int],
        prompt_speech: np.ndarray,
        generator: torch.Generator,
        forced_length: int | None = None,
        should_stop: StopCheck | None = None,
    ) -> SpeechTokens:
        start = time.perf_counter()
        outcome = DecodeOutcome()
        tokens = self.stream(
            text,
            prompt_text=prompt_text,
            prompt_speech=prompt_speech,
            generator=generator,
            forced_length=forced_length,
            should_stop=should_stop,
            outcome=outcome,
        )
        ids: list[int] = []
        first_s = 0.0
        for token in tokens:
            if not ids:
                first_s = time.perf_counter() - start
            ids.append(token)
        total = time.perf_counter() - start
        return SpeechTokens(np.asarray(ids, dtype=np.int32), first_s or total, outcome.stop)

    def stream(
        self,
        text: list[int],
        *,
        prompt_text: list[int],
        prompt_speech: np.ndarray,
        generator: torch.Generator,
        forced_length: int | None = None,
        should_stop: StopCheck | None = None,
        outcome: DecodeOutcome | None = None,
    ) -> Iterator[int]:
        """The same decode loop, one speech token at a time as it is sampled (streaming);
        `should_stop` is asked before each step (SynthesisCanceled when it says stop),
        `outcome` says how it ended once exhausted. CosyVoice 3: silent tokens past the
        model's run cap are not handed on (`cap_silent_runs`; the LLM still saw them)."""
        tokens = iter_speech_tokens(
            self.model,
            text,
            prompt_text=prompt_text,
            prompt_speech=torch.from_numpy(np.asarray(prompt_speech, dtype=np.int64)),
            generator=generator,
            forced_length=forced_length,
            outcome=outcome,
        )
        if self.model.config.silent_tokens:
            tokens = cap_silent_runs(tokens, self.model.config)
        return tokens if should_stop is None else _until_stopped(tokens, should_stop)


def _until_stopped(tokens: Iterator[int], should_stop: StopCheck) -> Iterator[int]:
    stop_if_asked(should_stop)
    for token in tokens:
        yield token
        stop_if_asked(should_stop)


def module_device(module: Any) -> torch.device:
    """Where a torch module's parameters live (CPU for objects without parameters)."""
    parameters = getattr(module, "parameters", None)
    first = next(iter(parameters()), None) if callable(parameters) else None
    return first.device if first is not None else torch.device("cpu")


class ModuleFlow:
    """Runs a flow object's `inference(token, prompt_token, prompt_feat, embedding)`.

    `stream_cache` (default on): a streamed piece runs our torch flow incrementally
    (`FlowStreamCache`); off, every hop re-runs the flow over the whole prefix (`mel_chunk`).
    `voice_prefixes`: the per-voice store of primed streams the cached path starts from (None:
    every piece computes its prompt's frames). `join_reduced_precision`: batch pieces in bf16 or
    fp16 too (`batches`), trading each piece's independence from its neighbours for speed.
    """

    def __init__(
        self,
        model: Any,
        *,
        name: str = "torch",
        device: torch.device | None = None,
        stream_cache: bool = True,
        voice_prefixes: VoicePrefixes | None = None,
        join_reduced_precision: bool = False,
    ):
        self.model = model
        self.join_reduced_precision = join_reduced_precision
        self.name = name
        self.device = device or module_device(model)
        self.stream_cache = stream_cache
        self.voice_prefixes = voice_prefixes

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

    @property
    def can_stream(self) -> bool:
        """Only our torch flow takes `streaming` / `finalize` (Core ML graphs are fixed)."""
        return isinstance(self.model, CausalMaskedDiffWithXvec)

    @property
    def lookahead(self) -> int:
        return int(self.model.config.encoder.pre_lookahead_len)

    @property
    def chunk_tokens(self) -> int:
        return int(self.model.config.encoder.static_chunk_size)

    def open_stream(
        self, prompt: VoicePrompt, *, cache_max_bytes: int | None = None
    ) -> BoundedFlowChunks | CachedFlowChunks | RecomputedFlowChunks:
        """One piece's flow stream (per piece state); a hop that would take the flow cache
        past `cache_max_bytes` and the piece's later hops are recomputed instead."""
        if not (self.stream_cache and isinstance(self.model, CausalMaskedDiffWithXvec)):
            return RecomputedFlowChunks(self, prompt)
        prefixes = self.voice_prefixes
        if cache_max_bytes is None:
            return CachedFlowChunks(self.model, prompt, self.device, prefixes=prefixes)
        cached = CachedFlowChunks(
            self.model, prompt, self.device, max_bytes=cache_max_bytes, prefixes=prefixes
        )
        return BoundedFlowChunks(cached, RecomputedFlowChunks(self, prompt))

    @torch.inference_mode()
    def mel_chunk(
        self, tokens: np.ndarray, prompt: VoicePrompt, *, offset: int, finalize: bool
    ) -> np.ndarray:
        """One streamed chunk recomputed from the start: chunk masks on, the mel after token
        `offset` (as upstream does; chunk masks make the earlier frames' values independent of
        what follows, so only the new frames are kept). The reference for `open_stream`'s
        incremental flow."""
        device = self.device
        mel, _ = self.model.inference(
            torch.from_numpy(np.asarray(tokens, dtype=np.int32))[None].to(device),
            torch.from_numpy(prompt.speech_tokens.astype(np.int32))[None].to(device),
            torch.from_numpy(prompt.mel)[None].to(device),
            torch.from_numpy(prompt.embedding)[None].to(device),
            streaming=True,
            finalize=finalize,
        )
        ratio = self.model.config.token_mel_ratio
        return mel[0, :, ratio * offset :].float().cpu().numpy()

    @property
    def batches(self) -> bool:
        """Whether `mels` can run many pieces at once: our torch flow module in float32, or a
        stand-in with its own `batched_inference` (a batched Core ML conversion). In bf16 or
        fp16 a row beside others differs from alone by a whole rounding step (~0.035 after
        HiFT on the tiny model; equal lengths too, as the products' blocking changes), so its
        audio would depend on its neighbours: there each piece's flow runs alone unless
        `join_reduced_precision` (fp32 padding stays within 1e-4 of alone)."""
        if isinstance(self.model, CausalMaskedDiffWithXvec):
            exact = next(self.model.parameters()).dtype == torch.float32
            return exact or self.join_reduced_precision
        return bool(getattr(self.model, "batched", False))

    def mels(
        self,
        pieces: Sequence[tuple[np.ndarray, VoicePrompt]],
        *,
        between_steps: Callable[[], None] | None = None,
    ) -> list[np.ndarray]:
        """Many (tokens, prompt) pieces in one padded batch -> each one's `mel`.

        `between_steps` runs between the torch flow's Euler steps (a batched Core ML flow's
        packages run each call whole, so there it is not called)."""
        rows = [
            FlowRow(
                torch.from_numpy(np.asarray(tokens, dtype=np.int32))[None],
                torch.from_numpy(prompt.speech_tokens.astype(np.int32))[None],
                torch.from_numpy(prompt.mel)[None],
                torch.from_numpy(prompt.embedding)[None],
            )
            for tokens, prompt in pieces
        ]
        if isinstance(self.model, CausalMaskedDiffWithXvec):
            mels = batched_inference(self.model, rows, between_steps=between_steps)
        else:
            mels = self.model.batched_inference(rows)
        return [mel.cpu().numpy() for mel in mels]


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


class ModuleVocoder:
    """Runs a vocoder object's `inference(mel, noise=...)` (it has a HiFTConfig `config`)."""

    def __init__(self, model: Any, *, name: str = "torch", device: torch.device | None = None):
        self.model = model
        self.name = name
        self.device = device or module_device(model)
        self.config: HiFTConfig = model.config

    @torch.inference_mode()
    def waveform(self, mel: np.ndarray, generator: torch.Generator) -> np.ndarray:
        return self.waveform_with(mel, self.noise(mel, generator))

    def noise(self, mel: np.ndarray, generator: torch.Generator) -> SourceNoise:
        """The source's random draws for `mel` (80, T), from `generator` as `waveform` draws."""
        samples = mel.shape[-1] * self.config.samples_per_frame
        return source_noise(self.config.nb_harmonics + 1, samples, generator, self.device)

    @torch.inference_mode()
    def waveform_with(self, mel: np.ndarray, noise: SourceNoise) -> np.ndarray:
        """`waveform` on draws already made (`noise`)."""
        out = self.model.inference(self._mel(mel), noise=noise)
        return out.wav[0].float().cpu().numpy()

    def _mel(self, mel: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(mel, dtype=np.float32))[None].to(self.device)

    @property
    def batches(self) -> bool:
        """Whether `waveforms` runs many pieces per call (a batched Core ML conversion; the
        torch vocoder runs per piece, ~5% of the time)."""
        return bool(getattr(self.model, "batched", False))

    @torch.inference_mode()
    def waveforms(
        self, mels: Sequence[np.ndarray], noises: Sequence[SourceNoise]
    ) -> list[np.ndarray]:
        """`waveform_with` for many pieces in as few calls as the model can (`batches`)."""
        if not self.batches:
            return [self.waveform_with(mel, noise) for mel, noise in zip(mels, noises, strict=True)]
        wavs = self.model.batched_inference([self._mel(mel) for mel in mels], noises)
        return [wav[0].float().cpu().numpy() for wav in wavs]

    @property
    def can_stream(self) -> bool:
        return isinstance(self.model, HiFTGenerator)

    @property
    def samples_per_frame(self) -> int:
        return int(self.config.samples_per_frame)

    @torch.inference_mode()
    def waveform_chunk(
        self, mel: np.ndarray, generator: torch.Generator, source_prefix: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """One streamed chunk: (wav, source); the source starts with `source_prefix` (the
        previous chunk's excitation of the frames both share)."""
        samples = mel.shape[-1] * self.config.samples_per_frame
        noise = source_noise(self.config.nb_harmonics + 1, samples, generator, self.device)
        prefix = None
        if source_prefix is not None:
            prefix = torch.from_numpy(np.ascontiguousarray(source_prefix))[None, None]
        out = self.model.inference(
            torch.from_numpy(np.ascontiguousarray(mel, dtype=np.float32))[None].to(self.device),
            noise=noise,
            source_prefix=None if prefix is None else prefix.to(self.device),
        )
        wav = out.wav[0].float().cpu().numpy()
        return wav, out.source[0, 0].float().cpu().numpy()
