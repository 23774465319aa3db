"""CosyVoice 3's vocoder stage and its streamed pieces, beside CosyVoice 2's (`stages`,
`streaming`).

The LLM stage is CosyVoice 2's (`ModuleSpeechTokens` over the same `Qwen2LM` class with
CosyVoice 3's config) and the flow's whole-piece call is too (`ModuleFlow.mel`: the DiT flow has
the same `inference` call shape). What parts:
- `CausalVocoder`: the causal HiFT is deterministic (a fixed noise buffer, no random source),
  so it takes the request's generator only to fit `VocoderStage` and draws nothing from it.
- `CausalPieceStream`: upstream's CosyVoice 3 chunk schedule (`workers.model.causal_stream`):
  the first hop 25 + (⌈P/25⌉·25 − P) tokens, then ×2 up to 100, 3 look-ahead tokens; each chunk
  re-runs the flow over all tokens so far (chunk masks, finalize False) and HiFT over all mel
  so far, and hands out only the new samples; the last call uses full attention. No mel or
  source cache and no cross-fade (CosyVoice 2's `PieceStream` has all three).
Both hold only the loaded model; a stream's state is one piece's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch

from workers.engine.api import VoicePrompt
from workers.engine.stages import module_device
from workers.engine.streaming import StreamSchedule, TimedStage
from workers.model.causal_hift.model import CausalHiFTGenerator
from workers.model.causal_stream import CausalTokenStream
from workers.model.causal_stream import StreamSchedule as CausalSchedule
from workers.model.dit.model import CausalMaskedDiffWithDiT
from workers.model.hift.model import HiFTOutput


class CausalVocoderModel(Protocol):
    """What `CausalVocoder` calls: the torch `CausalHiFTGenerator` or its Core ML stand-in."""

    def inference(self, mel: torch.Tensor, *, finalize: bool = True) -> HiFTOutput: ...


class CausalVocoder:
    """Runs the causal HiFT's `inference(mel, finalize=True)` on one piece's whole mel."""

    batches = False  # one piece per call (as CosyVoice 2's torch vocoder)

    def __init__(
        self,
        model: CausalHiFTGenerator | CausalVocoderModel,
        *,
        name: str = "torch",
        device: torch.device | None = None,
    ) -> None:
        self.model = model
        self.name = name
        self.device = device or module_device(model)

    @torch.inference_mode()
    def waveform(self, mel: np.ndarray, generator: torch.Generator) -> np.ndarray:
        """mel (80, T) -> (480·T,) float32; `generator` is not drawn from (fixed buffer)."""
        tensor = torch.from_numpy(np.ascontiguousarray(mel, dtype=np.float32))[None]
        return self.model.inference(tensor.to(self.device), finalize=True).wav[0].float().numpy()

    def noise(self, mel: np.ndarray, generator: torch.Generator) -> None:
        """No random draws: the batch session's per-row noise is None here."""
        return None

    def waveform_with(self, mel: np.ndarray, noise: None) -> np.ndarray:
        return self.waveform(mel, torch.Generator())

    def waveforms(self, mels: Sequence[np.ndarray], noises: Sequence[None]) -> list[np.ndarray]:
        return [self.waveform_with(mel, None) for mel in mels]


def causal_schedule(schedule: StreamSchedule, flow: CausalMaskedDiffWithDiT) -> CausalSchedule:
    """The engine's hop settings as CosyVoice 3's schedule (look-ahead from the flow)."""
    return CausalSchedule(
        token_hop=schedule.first_hop,
        max_hop=schedule.max_hop,
        scale=schedule.scale,
        lookahead=flow.config.pre_lookahead_len,
    )


class CausalPieceStream:
    """One piece's streamed synthesis on CosyVoice 3: `push` each token, then `finish`."""

    def __init__(
        self,
        flow: CausalMaskedDiffWithDiT,
        vocoder: CausalHiFTGenerator,
        prompt: VoicePrompt,
        *,
        schedule: StreamSchedule,
        timed: TimedStage,
    ) -> None:
        device = module_device(flow)
        self.stream = CausalTokenStream(
            flow,
            vocoder,
            torch.from_numpy(prompt.speech_tokens.astype(np.int64))[None].to(device),
            torch.from_numpy(np.ascontiguousarray(prompt.mel))[None].to(device),
            torch.from_numpy(np.ascontiguousarray(prompt.embedding))[None].to(device),
            schedule=causal_schedule(schedule, flow),
            timed=timed,
        )
        self.chunk_tokens: list[int] = []  # tokens per emitted chunk (bench, tests)

    def push(self, token: int) -> np.ndarray | None:
        """Add one token; the new samples when it completes a hop, else None."""
        offset = self.stream.offset
        chunks = [chunk.speech[0] for chunk in self.stream.feed([token])]
        if not chunks:
            return None
        self.chunk_tokens.append(self.stream.offset - offset)
        return torch.cat(chunks).float().cpu().numpy()

    def finish(self) -> np.ndarray:
        """The rest (finalize, full attention); empty when the piece had no tokens."""
        if not self.stream.tokens:
            return np.zeros(0, dtype=np.float32)
        self.chunk_tokens.append(len(self.stream.tokens) - self.stream.offset)
        return self.stream.finish().speech[0].float().cpu().numpy()
