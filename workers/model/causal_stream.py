"""CosyVoice 3's streaming token-to-waveform schedule (upstream's `CosyVoice3Model.tts` chunks).

One `CausalTokenStream` per request holds that request's state (tokens so far, hop, offset, mel
so far, samples emitted); the flow and vocoder are shared and stateless. The rules:

- P prompt tokens. The first hop is `token_hop` + (⌈P/`token_hop`⌉·`token_hop` − P) tokens, so
  chunk ends fall on the DiT's 50-frame chunk borders counted from the prompt's start; after each
  chunk the base hop grows ×`scale`, capped at `max_hop` (25+pad, 50, 100, 100, ...). Upstream
  keeps the grown hop on the model object for its next request; here it is per request.
- A chunk is made once the tokens not yet consumed reach hop + `lookahead`: the flow is re-run on
  ALL tokens so far (up to offset + hop + lookahead) with chunked attention and finalize False,
  and frames before `token_mel_ratio`·offset are dropped.
- `finish` runs the flow on all tokens with finalize True and full attention (streaming False).
- HiFT is re-run on all mel so far with the same finalize flag and only the samples beyond those
  already emitted are returned: no cross-fade, no source cache (CosyVoice 2 had both).
Without streaming, `finish` alone makes the whole utterance in one call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from workers.model.causal_hift.model import CausalHiFTGenerator
from workers.model.dit.model import CausalMaskedDiffWithDiT


@dataclass(frozen=True)
class StreamSchedule:
    """Upstream's streaming constants (tokens)."""

    token_hop: int = 25
    max_hop: int = 100
    scale: int = 2
    lookahead: int = 3

    def prompt_pad(self, prompt_tokens: int) -> int:
        """The tokens that bring the prompt to a multiple of `token_hop`."""
        return -(-prompt_tokens // self.token_hop) * self.token_hop - prompt_tokens

    def first_hop(self, prompt_tokens: int) -> int:
        """The first chunk's hop: `token_hop` + the prompt's pad."""
        return self.token_hop + self.prompt_pad(prompt_tokens)


@dataclass(frozen=True)
class StreamCall:
    """One flow + HiFT call: tokens passed, token offset, finalize, chunked attention."""

    tokens: int
    offset: int
    finalize: bool
    streaming: bool


@dataclass(frozen=True)
class StreamChunk:
    """What one call yields: new samples (1, n), its new mel (1, 80, m), the full source."""

    speech: Tensor
    mel: Tensor
    source: Tensor
    call: StreamCall


@dataclass
class CausalTokenStream:
    """Per-request streaming state over a shared flow and vocoder."""

    flow: CausalMaskedDiffWithDiT
    hift: CausalHiFTGenerator
    prompt_token: Tensor  # (1, P)
    prompt_feat: Tensor  # (1, 2P, 80)
    embedding: Tensor  # (1, 192)
    schedule: StreamSchedule = field(default_factory=StreamSchedule)
    streaming: bool = True  # False: `feed` only collects, `finish` makes everything
    tokens: list[int] = field(default_factory=list)
    offset: int = 0
    emitted: int = 0
    hop: int = -1
    mel: Tensor | None = None
    # each stage's time (the engine's clock): timed("flow") / timed("hift") wrap the calls
    timed: Callable[[str], contextlib.AbstractContextManager[None]] | None = None

    def __post_init__(self) -> None:
        if self.hop < 0:
            self.hop = self.schedule.token_hop

    def this_hop(self) -> int:
        """The next chunk's hop: the prompt's pad is added to the first one only."""
        pad = self.schedule.prompt_pad(self.prompt_token.size(1)) if self.offset == 0 else 0
        return self.hop + pad

    def feed(self, new_tokens: list[int]) -> Iterator[StreamChunk]:
        """Add generated tokens; yield every chunk they complete (none unless streaming)."""
        self.tokens.extend(new_tokens)
        lookahead = self.schedule.lookahead
        while self.streaming and len(self.tokens) - self.offset >= self.this_hop() + lookahead:
            hop = self.this_hop()
            call = StreamCall(self.offset + hop + lookahead, self.offset, False, True)
            yield self._run(call)
            self.offset += hop
            self.hop = min(self.hop * self.schedule.scale, self.schedule.max_hop)

    def finish(self) -> StreamChunk:
        """The last call: all tokens, finalize True, full attention."""
        return self._run(StreamCall(len(self.tokens), self.offset, True, False))

    @torch.inference_mode()
    def _run(self, call: StreamCall) -> StreamChunk:
        timed = self.timed or (lambda _stage: contextlib.nullcontext())
        token = torch.tensor([self.tokens[: call.tokens]], dtype=torch.int64)
        with timed("flow"):
            mel, _ = self.flow.inference(
                token.to(self.prompt_token.device),
                self.prompt_token,
                self.prompt_feat,
                self.embedding,
                streaming=call.streaming,
                finalize=call.finalize,
            )
        new_mel = mel[:, :, self.flow.config.token_mel_ratio * call.offset :]
        self.mel = new_mel if self.mel is None else torch.cat([self.mel, new_mel], dim=2)
        with timed("hift"):
            out = self.hift.inference(self.mel, finalize=call.finalize)
        speech = out.wav[:, self.emitted :]
        self.emitted += speech.size(1)
        return StreamChunk(speech, new_mel, out.source, call)
