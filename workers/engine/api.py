"""What the job functions need from a synthesis engine, and nothing more.

The engine (model code) knows nothing of queues, Redis, storage or settings: it takes plain
values and returns samples. Job functions talk to it only through `SynthesisEngine`, so the
worker's own tests can drive it with a test double kept in `tests/` (slow, crashing or leaking
on purpose) while the product always runs the real engine.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from shared.jobs import Mode


@dataclass(frozen=True)
class VoicePrompt:
    """A prompt's features, computed once and reused by every job naming the voice.

    Lengths are already trimmed 1:2 (`mel` has exactly 2 frames per speech token).
    """

    speech_tokens: np.ndarray  # (n,) int32, 25 Hz speech token ids
    mel: np.ndarray  # (2n, 80) float32, 24 kHz log-mel, time-major
    embedding: np.ndarray  # (192,) float32 CAM++ speaker embedding (not normalised)
    transcript: str  # what the prompt says; used by zero_shot


StopCheck = Callable[[], bool]  # True once the request was canceled: stop at the next step


class SynthesisCanceled(Exception):
    """The request's `should_stop()` said stop: raised at the next piece or LLM step."""


def stop_if_asked(should_stop: StopCheck | None) -> None:
    """Raise SynthesisCanceled when the request was canceled (cheap: the check caches)."""
    if should_stop is not None and should_stop():
        raise SynthesisCanceled("canceled")


@dataclass(frozen=True)
class SynthesisInput:
    """One request's plain values, already validated. `should_stop` is a plain callable the
    engine asks at each piece and LLM step (the worker's cancel flag; the engine never sees
    Redis)."""

    text: str
    prompt: VoicePrompt
    mode: Mode = "zero_shot"
    language: str = "auto"  # auto, en, zh, ja: how numbers and symbols are read
    instruction: str | None = None  # instruct2 only
    speed: float = 1.0
    seed: int | None = None
    should_stop: StopCheck | None = field(default=None, compare=False, repr=False)
    # Past the engine's max_speech_seconds: False refuses the request; True speaks it piece by
    # piece, each piece within the bound (a document's segment, sized by an estimate before
    # the model's own count, must never fail on length).
    split_past_limit: bool = False


@dataclass(frozen=True)
class ModelIdentity:
    """Which weights ran where: reported in worker_ready and in every result."""

    name: str  # e.g. "CosyVoice2-0.5B" or "cosyq-tiny"
    checkpoint_hash: str  # hash over llm.pt, flow.pt, hift.pt
    backend: str  # "torch" or "coreml"
    device: str  # "cpu", "mps", "cuda", "ane/gpu/cpu" ...
    family: str = "cosyvoice2"  # the model directory's family: cosyvoice2 or cosyvoice3


@dataclass(frozen=True)
class PieceSpan:
    """One piece of the text, where its audio lies in the output (samples, end exclusive) and
    how the LLM ended it (plain data for captions and for the service's quality check)."""

    text: str  # the piece as the model read it (after normalisation)
    start: int
    end: int
    speech_tokens: int = 0
    stop: str = "unknown"  # stop_token, length_bound (a runaway), forced, unknown
    tail_repeat: float = 0.0  # 0-1: how periodic its last 2 s of tokens are (1: a loop)


@dataclass
class SynthesisOutput:
    """24 kHz mono samples plus what each stage cost."""

    samples: np.ndarray  # (N,) float32 in [-1, 1]
    sample_rate: int
    stage_seconds: dict[str, float] = field(default_factory=dict)  # frontend, llm, flow, hift, join
    speech_tokens: int = 0
    batch_size: int = 1  # the most requests that shared an LLM step with this one
    chunk_samples: list[int] = field(default_factory=list)  # streamed: each chunk's length
    pieces: list[PieceSpan] = field(default_factory=list)  # in order; empty: not reported
    text_tokens: int = 0  # TTS text tokens after normalisation (the length estimate's input)
    seed: int | None = None  # the seed the engine drew with (a fresh one when none was asked)


ChunkSink = Callable[[np.ndarray], None]  # one streamed chunk, 24 kHz float32 (N,)


class SynthesisEngine(Protocol):
    """A loaded model that turns text into samples; one per worker process."""

    identity: ModelIdentity
    sample_rate: int

    def warm_up(self) -> None:
        """Run every shape the backend compiles for, so the first real job is not slow."""

    def synthesize(self, request: SynthesisInput) -> SynthesisOutput:
        """Text to samples. Raises InvalidRequestError for input that can never succeed."""

    def extract_voice(self, samples: np.ndarray, sample_rate: int, transcript: str) -> VoicePrompt:
        """Prompt audio (any rate >= 16 kHz, mono float32) to reusable voice features."""


@runtime_checkable
class StreamingEngine(Protocol):
    """An engine that hands out audio while it synthesizes (CosyVoice 2's streaming mode)."""

    def synthesize_streaming(self, request: SynthesisInput, on_chunk: ChunkSink) -> SynthesisOutput:
        """Text to samples, calling `on_chunk` with each chunk as it is ready; the output's
        samples are the chunks concatenated."""
        ...
