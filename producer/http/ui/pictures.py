"""A job's waveform and spectrogram as PNG, drawn server-side with numpy (no plotting library).

The PNG is written by hand (signature, IHDR, one zlib-compressed IDAT of filter-0 rows, IEND):
8-bit RGB, a few kilobytes for a 1000 x 120 picture.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import soundfile

WIDTH = 1000  # pixels: the player's width on the job page
WAVE_HEIGHT = 120
SPECTRUM_HEIGHT = 160
N_FFT = 1024  # 43 ms at 24 kHz: a readable speech spectrogram
FLOOR_DB = -90.0  # quieter than this is drawn black
BACKGROUND = (250, 250, 252)
INK = (36, 90, 160)
# A dark-to-light palette (black, violet, orange, pale yellow), interpolated over 0..1.
PALETTE = np.array([[0, 0, 4], [80, 18, 123], [182, 54, 121], [251, 136, 97], [252, 253, 191]])


def decode(data: bytes) -> tuple[np.ndarray, int]:
    """Mono float samples and their rate from a stored file (any format soundfile reads)."""
    samples, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    return samples.mean(axis=1), int(rate)


def waveform_png(samples: np.ndarray, *, width: int = WIDTH, height: int = WAVE_HEIGHT) -> bytes:
    """Each column the min..max of its share of the samples, on a light background."""
    image = np.empty((height, width, 3), dtype=np.uint8)
    image[:] = BACKGROUND
    image[height // 2, :] = (200, 200, 210)
    if samples.size:
        edges = np.linspace(0, samples.size, width + 1).astype(int)
        for x in range(width):
            part = samples[edges[x] : max(edges[x + 1], edges[x] + 1)]
            top = _row(float(part.max()), height)
            bottom = _row(float(part.min()), height)
            image[top : bottom + 1, x] = INK
    return png(image)


def _row(value: float, height: int) -> int:
    """The pixel row of a sample value in -1..1 (+1 at the top)."""
    clipped = min(1.0, max(-1.0, value))
    return round((1.0 - clipped) / 2 * (height - 1))


def spectrogram_png(
    samples: np.ndarray, rate: int, *, width: int = WIDTH, height: int = SPECTRUM_HEIGHT
) -> bytes:
    """Log-magnitude STFT (Hann window), low frequencies at the bottom, to rate / 2."""
    if samples.size < N_FFT:
        samples = np.pad(samples, (0, N_FFT - samples.size))
    hop = max(1, (samples.size - N_FFT) // max(1, width - 1))
    starts = np.arange(0, samples.size - N_FFT + 1, hop)[:width]
    frames = np.stack([samples[s : s + N_FFT] for s in starts]) * np.hanning(N_FFT)
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2  # (frames, N_FFT / 2 + 1)
    db = 10 * np.log10(power + 1e-12)
    level = np.clip((db - FLOOR_DB) / (db.max() - FLOOR_DB + 1e-9), 0.0, 1.0)
    rows = np.linspace(0, level.shape[1] - 1, height).astype(int)[::-1]
    columns = np.linspace(0, level.shape[0] - 1, width).astype(int)
    picture = level[columns][:, rows].T  # (height, width), high frequencies first
    return png(_colour(picture))


def _colour(level: np.ndarray) -> np.ndarray:
    stops = np.linspace(0.0, 1.0, len(PALETTE))
    channels = [np.interp(level, stops, PALETTE[:, c]) for c in range(3)]
    return np.stack(channels, axis=-1).astype(np.uint8)


def png(image: np.ndarray) -> bytes:
    """An (height, width, 3) uint8 array as an 8-bit RGB PNG."""
    height, width, _ = image.shape
    rows = np.concatenate([np.zeros((height, 1), np.uint8), image.reshape(height, -1)], axis=1)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"".join(
        [
            b"\x89PNG\r\n\x1a\n",
            _chunk(b"IHDR", header),
            _chunk(b"IDAT", zlib.compress(rows.tobytes(), 6)),
            _chunk(b"IEND", b""),
        ]
    )


def _chunk(kind: bytes, data: bytes) -> bytes:
    crc = zlib.crc32(kind + data) & 0xFFFFFFFF
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)
