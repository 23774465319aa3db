"""The fade every join uses, without torch: pieces inside a job (`assembly.join_pieces`, the
stream joiner) and segments of a document (`workers.documents.audio`) fade alike."""

from __future__ import annotations

import numpy as np

DEFAULT_FADE_S = 0.01  # 10 ms raised cosine: below what the ear hears as a change in loudness


def fade_ramp(length: int) -> np.ndarray:
    """Raised-cosine fade-in of `length` samples, from 0 up to (not including) 1."""
    return (0.5 - 0.5 * np.cos(np.pi * np.arange(length) / max(length, 1))).astype(np.float32)
