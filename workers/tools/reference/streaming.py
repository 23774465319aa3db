"""Parity of the engine's chunked streaming flow with the reference streaming arrays.

The engine's own `PieceStream` runs the set's tiny flow on the reference tokens hop by hop, as
a streamed job does (upstream's schedule: the first hop 25 tokens lengthened to the next flow
chunk edge, `finalize=False` with the 3 look-ahead tokens held back, `finalize=True` on the
last, partly full chunk), with the incremental flow cache a streamed job uses. Its chunks'
mels, concatenated, must equal `mel_stream_finalize`; the non-final chunks' mels must equal
`mel_stream_nofinalize` as far as they reach.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from workers.engine.api import VoicePrompt
from workers.engine.stages import ModuleFlow
from workers.engine.streaming import PieceStream, StreamSchedule
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.tools.reference.flow import MEL_TOL, REFERENCE_FILE, load_reference_flow
from workers.tools.reference.parity import ArrayCheck, ReferenceSet, compare

CPU = torch.device("cpu")


class _NoVocoder:
    """Stands in for HiFT: the check is about the flow's chunks, the audio is not used."""

    samples_per_frame = 480

    def waveform_chunk(
        self, mel: np.ndarray, generator: torch.Generator, source_prefix: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        samples = np.zeros(mel.shape[1] * self.samples_per_frame, dtype=np.float32)
        return samples, samples


@contextlib.contextmanager
def _untimed(_stage: str) -> Iterator[None]:
    yield


def chunked_mels(
    flow: CausalMaskedDiffWithXvec,
    arrays: dict[str, np.ndarray],
    schedule: StreamSchedule,
    *,
    cached: bool = True,
) -> tuple[list[np.ndarray], list[int]]:
    """Each streamed chunk's mel and token count, for the reference call's inputs; `cached`:
    the engine's incremental flow (else every hop recomputes the prefix)."""
    prompt = VoicePrompt(
        speech_tokens=arrays["prompt_token"][0].astype(np.int32),
        mel=arrays["prompt_feat"][0],
        embedding=arrays["embedding"][0],
        transcript="",
    )
    stream = PieceStream(
        ModuleFlow(flow, stream_cache=cached),
        _NoVocoder(),
        prompt,
        torch.Generator().manual_seed(0),
        schedule=schedule,
        timed=_untimed,
        keep_mels=True,
    )
    for token in arrays["token"][0]:
        stream.push(int(token))
    stream.finish()
    assert stream.mels is not None
    return stream.mels, stream.chunk_tokens


def check_streaming(ref: ReferenceSet, device: torch.device = CPU) -> list[ArrayCheck]:
    """The chunked streaming mel against both streaming arrays (when the set has them)."""
    arrays = ref.arrays(REFERENCE_FILE)
    if "mel_stream_finalize" not in arrays:
        return []
    with torch.inference_mode():
        mels, _tokens = chunked_mels(load_reference_flow(ref, device), arrays, StreamSchedule())
    whole = np.concatenate(mels, axis=1)[None]
    checks = [
        compare("stream_chunks:mel_stream_finalize", whole, arrays["mel_stream_finalize"], MEL_TOL)
    ]
    if "mel_stream_nofinalize" in arrays and len(mels) > 1:
        early = np.concatenate(mels[:-1], axis=1)[None]
        reference = arrays["mel_stream_nofinalize"][:, :, : early.shape[-1]]
        checks.append(compare("stream_chunks:mel_stream_nofinalize", early, reference, MEL_TOL))
    return checks
