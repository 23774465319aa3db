"""Turning the pieces' outputs into one utterance: speed change on the mel, clean joins.

Speed: as upstream does, a speed other than 1 stretches the mel in time (linear interpolation
to round(T / speed) frames) before the vocoder, so pitch is kept and the vocoder sees an
ordinary mel; 2.0 halves the duration, 0.5 doubles it.

Joins: each piece is synthesized on its own (as upstream does), so its audio starts and ends
wherever the vocoder left it. Concatenating them directly can click; we fade each piece out
and the next one in over `fade_s` (a raised-cosine ramp, 10 ms: below what the ear hears as a
change in loudness) and put `gap_s` of silence between them, a sentence pause (100 ms; a
pause the speaker's own sentences rarely undercut); an SSML <break> sets that pause instead,
and one before the first or after the last piece becomes leading or trailing silence.
Crossfading overlapping audio instead would
blend two different sentence ends, so we do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from workers.engine.fades import DEFAULT_FADE_S, fade_ramp


@dataclass(frozen=True)
class JoinConfig:
    """How pieces are joined (seconds)."""

    gap_s: float = 0.1
    fade_s: float = DEFAULT_FADE_S

    def __post_init__(self) -> None:
        if self.gap_s < 0 or self.fade_s < 0:
            raise ValueError("gap_s and fade_s must be >= 0")


def change_speed(mel: np.ndarray, speed: float) -> np.ndarray:
    """mel (80, T) -> (80, max(1, round(T / speed))) by linear interpolation in time."""
    if speed == 1.0:
        return mel
    if speed <= 0:
        raise ValueError(f"speed must be > 0, got {speed}")
    frames = max(1, round(mel.shape[-1] / speed))
    stretched = F.interpolate(torch.from_numpy(mel)[None], size=frames, mode="linear")
    return stretched[0].numpy()


def join_pieces(
    pieces: Sequence[np.ndarray],
    sample_rate: int,
    config: JoinConfig,
    *,
    gaps: Sequence[float | None] = (),
    lead_s: float = 0.0,
    tail_s: float = 0.0,
) -> np.ndarray:
    """Pieces (N_i,) float32 -> one (N,) array; a single piece without pauses is returned
    untouched. `gaps[i]` replaces `config.gap_s` between piece i and i + 1 (an SSML break;
    None keeps the usual gap); `lead_s` and `tail_s` are silence before and after."""
    if len(pieces) == 1 and not lead_s and not tail_s:
        return pieces[0]
    fade = round(config.fade_s * sample_rate)
    parts: list[np.ndarray] = [_silence(lead_s, sample_rate)]
    for index, samples in enumerate(pieces):
        piece = np.array(samples, dtype=np.float32)  # a copy: faded in place
        n = min(fade, piece.shape[0] // 2)
        if n and len(pieces) > 1:
            ramp = fade_ramp(n)
            if index > 0:
                piece[:n] *= ramp
            if index < len(pieces) - 1:
                piece[-n:] *= ramp[::-1]
        if index > 0:
            gap = gaps[index - 1] if index - 1 < len(gaps) else None
            parts.append(_silence(config.gap_s if gap is None else gap, sample_rate))
        parts.append(piece)
    parts.append(_silence(tail_s, sample_rate))
    return np.concatenate(parts)


def piece_spans(
    lengths: Sequence[int],
    sample_rate: int,
    config: JoinConfig,
    *,
    gaps: Sequence[float | None] = (),
    lead_s: float = 0.0,
) -> list[tuple[int, int]]:
    """Where each piece lies in `join_pieces`' output: (first sample, end sample) per piece,
    by the same arithmetic (a piece's fades stay inside it; pauses lie between)."""
    spans = []
    position = round(lead_s * sample_rate)
    for index, length in enumerate(lengths):
        if index > 0:
            gap = gaps[index - 1] if index - 1 < len(gaps) else None
            position += round((config.gap_s if gap is None else gap) * sample_rate)
        spans.append((position, position + int(length)))
        position += int(length)
    return spans


def _silence(seconds: float, sample_rate: int) -> np.ndarray:
    return np.zeros(round(seconds * sample_rate), dtype=np.float32)
