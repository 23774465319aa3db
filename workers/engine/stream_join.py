"""The pieces' joins (`assembly.join_pieces`) applied as the audio streams: the same fades,
pauses and leading/trailing silence, emitted chunk by chunk.

Each piece's last `fade` samples are held back until the piece ends (its fade-out needs to
know where it ends), so the emitted samples, concatenated, equal `join_pieces` of the whole
pieces exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from workers.engine.assembly import JoinConfig, fade_ramp

Emit = Callable[[np.ndarray], None]


class StreamJoiner:
    """Feed each piece's audio in order (`start_piece`, `feed`..., `end_piece`), then `finish`."""

    def __init__(
        self,
        pieces: int,
        sample_rate: int,
        config: JoinConfig,
        emit: Emit,
        *,
        gaps: Sequence[float | None] = (),
        lead_s: float = 0.0,
        tail_s: float = 0.0,
    ) -> None:
        self.pieces = pieces
        self.sample_rate = sample_rate
        self.config = config
        self.gaps = list(gaps)
        self.lead_s = lead_s
        self.tail_s = tail_s
        self.fade = round(config.fade_s * sample_rate) if pieces > 1 else 0
        self._emit = emit
        self.emitted: list[np.ndarray] = []
        self._sent = 0  # samples emitted so far
        self._piece_start = 0
        self._index = -1
        self._pending = np.zeros(0, dtype=np.float32)
        self._head_done = False
        self.lengths: list[int] = []  # each ended piece's samples (pauses excluded)

    def start_piece(self) -> None:
        self._index += 1
        if self._index == 0:
            self._send(self._silence(self.lead_s))
        else:
            gap = self.gaps[self._index - 1] if self._index - 1 < len(self.gaps) else None
            self._send(self._silence(self.config.gap_s if gap is None else gap))
        self._pending = np.zeros(0, dtype=np.float32)
        self._head_done = False
        self._piece_start = self._sent

    def feed(self, samples: np.ndarray) -> None:
        """More of the current piece's samples; emits all but the held-back tail."""
        self._pending = np.concatenate([self._pending, np.asarray(samples, dtype=np.float32)])
        fade = self.fade
        if not self._head_done:
            if self._pending.size < 2 * fade:
                return  # too short to know the fade length yet (join_pieces: min(fade, N//2))
            if fade and self._index > 0:
                self._pending[:fade] *= fade_ramp(fade)
            self._head_done = True
        if self._pending.size > fade:
            cut = self._pending.size - fade
            self._send(self._pending[:cut])
            self._pending = self._pending[cut:].copy()

    def end_piece(self) -> None:
        piece = self._pending
        last = self._index == self.pieces - 1
        if not self._head_done:  # the whole piece is still here and shorter than two fades
            n = min(self.fade, piece.size // 2)
            if n and self._index > 0:
                piece[:n] *= fade_ramp(n)
        else:
            n = min(self.fade, piece.size)
        if n and not last:
            piece[-n:] *= fade_ramp(n)[::-1]
        self._send(piece)
        self._pending = np.zeros(0, dtype=np.float32)
        self.lengths.append(self._sent - self._piece_start)

    def finish(self) -> np.ndarray:
        """Emit the trailing silence; returns everything emitted, concatenated."""
        self._send(self._silence(self.tail_s))
        if not self.emitted:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(self.emitted)

    def _send(self, samples: np.ndarray) -> None:
        if samples.size:
            chunk = np.ascontiguousarray(samples, dtype=np.float32)
            self.emitted.append(chunk)
            self._sent += chunk.size
            self._emit(chunk)

    def _silence(self, seconds: float) -> np.ndarray:
        return np.zeros(round(seconds * self.sample_rate), dtype=np.float32)
