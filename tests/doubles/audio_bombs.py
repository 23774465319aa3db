"""Small audio files that decode to far more than their size: a FLAC of digital silence, which
libFLAC stores as one constant per block (about 2,000 times smaller than its float32 samples).
What a hostile tenant uploads as a voice prompt to make the front or a worker decode gigabytes.
"""

from __future__ import annotations

import io
import struct

import numpy as np
import soundfile as sf

FLAC_TOTAL_SAMPLES_AT = 8 + 10  # "fLaC", the block header, then STREAMINFO's 10th byte
TOTAL_SAMPLES_BITS = 36


def silent_flac(
    seconds: float, *, rate: int = 48000, channels: int = 2, state_length: bool = True
) -> bytes:
    """`seconds` of digital silence as FLAC; `state_length=False` clears STREAMINFO's total
    samples (0: unknown, as a streaming encoder writes it), so only decoding tells the length."""
    buffer = io.BytesIO()
    block = np.zeros((rate * 10, channels), dtype=np.int16)
    with sf.SoundFile(buffer, "w", rate, channels, format="FLAC", subtype="PCM_16") as out:
        left = round(seconds * rate)
        while left > 0:
            out.write(block[: min(left, len(block))])
            left -= len(block)
    data = bytearray(buffer.getvalue())
    if not state_length:
        at = FLAC_TOTAL_SAMPLES_AT
        packed = int.from_bytes(data[at : at + 8], "big")
        packed &= ~((1 << TOTAL_SAMPLES_BITS) - 1)
        data[at : at + 8] = packed.to_bytes(8, "big")
    return bytes(data)


def decoded_bytes(seconds: float, *, rate: int = 48000, channels: int = 2) -> int:
    """What `silent_flac` decodes to as float32 samples (soundfile's array)."""
    return round(seconds * rate) * channels * 4


def lying_wav(
    samples: bytes, *, rate: int = 16000, channels: int = 1, data_bytes: int | None = None
) -> bytes:
    """A PCM16 WAV of `samples` whose header states `rate`, `channels` and a data chunk of
    `data_bytes` (default: the truth), whatever the bytes hold."""
    block = channels * 2
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * block, block, 16)
    stated = len(samples) if data_bytes is None else data_bytes
    chunks = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    chunks += b"data" + struct.pack("<I", stated) + samples
    return b"RIFF" + struct.pack("<I", len(chunks)) + chunks


def silent_mp3(seconds: float, *, rate: int = 16000) -> bytes:
    """`seconds` of silence as MP3 at its lowest bitrate (8 kbps at 16 kHz: ~1 KB a second)."""
    buffer = io.BytesIO()
    block = np.zeros(rate * 10, dtype=np.float32)
    with sf.SoundFile(
        buffer, "w", rate, 1, format="MP3", subtype="MPEG_LAYER_III",
        compression_level=0.99, bitrate_mode="CONSTANT",
    ) as out:  # fmt: skip
        left = round(seconds * rate)
        while left > 0:
            out.write(block[: min(left, len(block))])
            left -= len(block)
    return buffer.getvalue()
