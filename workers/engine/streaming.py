"""CosyVoice 2's streaming token-to-wave path for one piece: token hops, chunked flow, HiFT caches.

As upstream schedules it: the first hop is 25 tokens (1 s of audio), lengthened so that its end
lines up with the flow's 25-token attention chunks counted from the start of the prompt; each
later hop doubles, up to 100. A hop is run once its tokens and the flow's look-ahead tokens
(3) exist: the flow runs with `streaming=True` (chunk masks) and `finalize=False` (the
look-ahead tokens are context only) and gives the mel frames after the previous hop. When
the LLM ends, the rest runs with `finalize=True`. The flow stream (`StreamingFlow.open_stream`,
for our torch flow `workers.model.flow.stream.FlowStreamCache`) keeps what earlier hops
computed, so a hop costs its own frames, not the whole prefix again.

HiFT runs per chunk on the chunk's mel with the previous chunk's last 8 mel frames in front;
the excitation of those frames is overwritten by the previous chunk's source (so the sine
phase continues), and the first 3840 samples (8 frames) are cross-faded with a Hamming window
against the previous chunk's held-back tail. Each chunk but the last holds back its last 3840
samples for that fade. The streamed audio therefore differs from the non-streaming waveform.

All of it is per piece state (`PieceStream`), created per request: nothing carries over to the
next request (upstream keeps its hop length on the model object, so its next request starts
with the grown hop).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from workers.engine.api import VoicePrompt

TimedStage = Callable[[str], contextlib.AbstractContextManager[None]]


@dataclass(frozen=True)
class StreamSchedule:
    """Token hops and HiFT cache sizes (upstream's values)."""

    first_hop: int = 25  # tokens
    max_hop: int = 100
    scale: int = 2
    mel_cache_frames: int = 8
    flow_cache_max_mb: float = 2048.0  # per piece; past it later hops recompute the prefix
    voice_cache_max_mb: float = 1024.0  # primed prompt prefixes kept per process (0: none)
    align_prompt: bool = False  # the flow's prompt starts P mod C tokens later: no first-hop pad

    def __post_init__(self) -> None:
        if self.first_hop < 1 or self.max_hop < self.first_hop or self.scale < 1:
            raise ValueError("stream schedule: need 1 <= first_hop <= max_hop and scale >= 1")
        if not self.flow_cache_max_mb > 0:
            raise ValueError("stream schedule: flow_cache_max_mb must be > 0")
        if self.voice_cache_max_mb < 0:
            raise ValueError("stream schedule: voice_cache_max_mb must be >= 0")

    def hops(self, prompt_tokens: int, chunk_tokens: int) -> Iterator[int]:
        """Hop lengths in tokens; the first is padded by ceil(P/C)·C − P (P prompt tokens, C
        the flow's chunk). With hops that are multiples of C (upstream's 25, 50, 100) every
        chunk ends on a flow chunk edge, so the chunks' mels equal one streaming pass over
        all tokens; other hops are allowed (shorter first chunks) but differ at the edges."""
        pad = -prompt_tokens % chunk_tokens if chunk_tokens > 0 else 0
        hop = self.first_hop
        yield hop + pad
        while True:
            hop = min(self.max_hop, hop * self.scale)
            yield hop


def chunk_aligned(prompt: VoicePrompt, chunk_tokens: int) -> VoicePrompt:
    """The prompt without its first P mod C speech tokens and their mel frames (P prompt
    tokens, C the flow's chunk; kept whole when shorter than one chunk): it then ends on a
    chunk edge, so a streamed piece's first hop needs no pad and a voice's primed prefix
    (`voice_prefixes`) covers all of it. The speaker embedding and transcript stay."""
    tokens = int(prompt.speech_tokens.size)
    drop = tokens % chunk_tokens if chunk_tokens > 0 else 0
    if drop == 0 or tokens < chunk_tokens:
        return prompt
    frames = prompt.mel.shape[0] // tokens if tokens else 0  # the mel's frames per token (2)
    return VoicePrompt(
        speech_tokens=prompt.speech_tokens[drop:],
        mel=prompt.mel[frames * drop :],
        embedding=prompt.embedding,
        transcript=prompt.transcript,
    )


class FlowChunks(Protocol):
    """One piece's streamed flow: each call gets the tokens after those of the calls before."""

    def mel(self, tokens: np.ndarray, *, finalize: bool) -> np.ndarray:
        """New tokens (n,) -> mel (80, frames) of the tokens not returned yet, the last
        `lookahead` tokens given so far excluded unless finalize."""


@runtime_checkable
class StreamingFlow(Protocol):
    """A flow stage that can stream a piece chunk by chunk."""

    @property
    def lookahead(self) -> int:
        """Tokens the flow reads past a non-final chunk's end."""

    @property
    def chunk_tokens(self) -> int:
        """The encoder's attention chunk, in tokens."""

    def open_stream(self, prompt: VoicePrompt, *, cache_max_bytes: int | None = None) -> FlowChunks:
        """A new piece's flow stream (its own state: one per piece), holding at most
        `cache_max_bytes` of cache where it keeps one."""


@runtime_checkable
class StreamingVocoder(Protocol):
    @property
    def samples_per_frame(self) -> int: ...

    def waveform_chunk(
        self, mel: np.ndarray, generator: torch.Generator, source_prefix: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """mel (80, T) -> (wav (480·T,), source (480·T,)); the source's start is overwritten
        by `source_prefix`."""


def hamming(length: int) -> np.ndarray:
    """numpy's symmetric Hamming window (upstream's `speech_window`), float32."""
    return np.hamming(length).astype(np.float32)


class PieceStream:
    """One piece's streamed synthesis: `push` each token as the LLM makes it, then `finish`."""

    def __init__(
        self,
        flow: StreamingFlow,
        vocoder: StreamingVocoder,
        prompt: VoicePrompt,
        generator: torch.Generator,
        *,
        schedule: StreamSchedule,
        timed: TimedStage,
        keep_mels: bool = False,
    ) -> None:
        self.flow = flow
        self.vocoder = vocoder
        if schedule.align_prompt:
            prompt = chunk_aligned(prompt, flow.chunk_tokens)
        self.prompt = prompt  # the flow's prompt
        self.generator = generator
        self.timed = timed
        with timed("flow"):  # a voice's first piece primes its prompt's frames here
            self.flow_chunks = flow.open_stream(
                prompt, cache_max_bytes=int(schedule.flow_cache_max_mb * 2**20)
            )
        self.prefix_use = getattr(self.flow_chunks, "prefix_use", None)  # bench, tests
        self.tokens: list[int] = []
        self.offset = 0  # tokens whose mel frames were emitted
        self.given = 0  # tokens handed to the flow (the look-ahead ones too)
        self.hops = schedule.hops(int(prompt.speech_tokens.size), flow.chunk_tokens)
        self.hop = next(self.hops)
        self.cache_frames = schedule.mel_cache_frames
        self.overlap = schedule.mel_cache_frames * vocoder.samples_per_frame
        self.window = hamming(2 * self.overlap)
        self.chunk_tokens: list[int] = []  # tokens per emitted chunk (bench, tests)
        self.mels: list[np.ndarray] | None = [] if keep_mels else None  # each chunk's flow mel
        self._mel: np.ndarray | None = None  # last frames of the previous chunk's mel
        self._source: np.ndarray | None = None
        self._speech: np.ndarray | None = None

    def push(self, token: int) -> np.ndarray | None:
        """Add one token; returns a chunk's samples when a hop completes, else None."""
        self.tokens.append(token)
        if len(self.tokens) - self.offset < self.hop + self.flow.lookahead:
            return None
        end = self.offset + self.hop
        ids = np.asarray(self.tokens[self.given : end + self.flow.lookahead], dtype=np.int32)
        self.given = end + self.flow.lookahead
        with self.timed("flow"):
            mel = self.flow_chunks.mel(ids, finalize=False)
        self.chunk_tokens.append(self.hop)
        if self.mels is not None:
            self.mels.append(mel)
        self.offset = end
        self.hop = next(self.hops)
        return self._vocode(mel, final=False)

    def finish(self) -> np.ndarray:
        """The last chunk (finalize=True): the tokens after the last hop, and the held tail."""
        if not self.tokens:
            return np.zeros(0, dtype=np.float32)
        rest = len(self.tokens) - self.offset
        mel = np.zeros((self._mel_bins(), 0), dtype=np.float32)
        if rest > 0:
            ids = np.asarray(self.tokens[self.given :], dtype=np.int32)
            self.given = len(self.tokens)
            with self.timed("flow"):
                mel = self.flow_chunks.mel(ids, finalize=True)
        self.chunk_tokens.append(rest)
        if self.mels is not None:
            self.mels.append(mel)
        return self._vocode(mel, final=True)

    def _mel_bins(self) -> int:
        return int(self.prompt.mel.shape[1])

    def _vocode(self, mel: np.ndarray, *, final: bool) -> np.ndarray:
        prefix = None
        if self._mel is not None:
            mel = np.concatenate([self._mel, mel], axis=1)
            prefix = self._source
        if mel.shape[1] == 0:
            return np.zeros(0, dtype=np.float32)
        with self.timed("hift"):
            wav, source = self.vocoder.waveform_chunk(mel, self.generator, prefix)
        wav = np.array(wav, dtype=np.float32)
        if self._speech is not None:  # the cached 8 frames start this chunk: fade them
            n = self.overlap
            wav[:n] = wav[:n] * self.window[:n] + self._speech * self.window[n:]
        if final:
            return wav
        self._mel = mel[:, -self.cache_frames :].copy()
        self._source = np.array(source[-self.overlap :], dtype=np.float32)
        self._speech = wav[-self.overlap :].copy()
        return wav[: -self.overlap]
