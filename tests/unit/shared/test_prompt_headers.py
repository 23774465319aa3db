"""Voice prompts whose headers lie, or that decode to far more than their size, against the
one decoder the front and the worker share (`decode_prompt_audio`): each refused with a reason
before much is allocated, or decoded no further than the bytes hold (peak by tracemalloc)."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from shared.voices import PromptAudioError, decode_prompt_audio
from tests.doubles.audio_bombs import lying_wav, silent_mp3

MAX_S = 30
PEAK_BYTES = 64 * 1024 * 1024  # a real 30 s prompt at 192 kHz is 23 MB of float32
SPEECH = (np.random.default_rng(0).standard_normal(16000 * 5) * 3000).astype("<i2").tobytes()


def peak_of(decode: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        decode()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("data", "refusal"),
    [
        (lambda: lying_wav(SPEECH, rate=1), "1 Hz, need at least 16000 Hz"),
        (lambda: lying_wav(SPEECH, rate=10**9), "1000000000 Hz, at most 192000 Hz"),
        (lambda: lying_wav(SPEECH, channels=0), "not a readable audio file"),
        (lambda: silent_mp3(10 * 60), r"600\.\d s, limit 30 s"),
    ],
    ids=["1-hz", "1-ghz", "no-channels", "mp3-8-kbps-10-min"],
)
def test_a_lying_or_inflating_prompt_is_refused_by_its_header(
    data: Callable[[], bytes], refusal: str
) -> None:
    upload = data()
    with pytest.raises(PromptAudioError, match=refusal):
        peak = peak_of(lambda: decode_prompt_audio(upload, max_seconds=MAX_S))
        raise AssertionError(f"decoded, {peak:,} bytes at peak")


@pytest.mark.parametrize(
    ("upload", "frames"),
    [
        (lying_wav(SPEECH, data_bytes=0xFFFF_FFF0), len(SPEECH) // 2),  # 4 GB stated, 160 KB sent
        (lying_wav(SPEECH * 51, channels=255), len(SPEECH) * 51 // (2 * 255)),  # mixed per block
    ],
    ids=["data-chunk-4-gb", "255-channels"],
)
def test_a_header_claiming_more_decodes_only_what_the_bytes_hold(
    upload: bytes, frames: int
) -> None:
    decoded: list[np.ndarray] = []
    peak = peak_of(lambda: decoded.append(decode_prompt_audio(upload, max_seconds=MAX_S)[0]))
    assert [samples.shape for samples in decoded] == [(frames,)]  # mono, the bytes' length
    assert peak < PEAK_BYTES, f"{peak:,} bytes held decoding a {len(upload):,}-byte file"
