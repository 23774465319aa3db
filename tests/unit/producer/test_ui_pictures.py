"""The /ui pictures are real PNGs that show the audio: decoded here by hand (zlib, filter 0),
a full-scale sine's waveform spans the picture's height and a silent one is a flat line; a
1 kHz tone's spectrogram is brightest at the row of 1 kHz."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import soundfile

from producer.http.ui.pictures import (
    BACKGROUND,
    SPECTRUM_HEIGHT,
    decode,
    png,
    spectrogram_png,
    waveform_png,
)

RATE = 24000


def read_png(data: bytes) -> np.ndarray:
    """(height, width, 3) from an 8-bit RGB PNG of one IDAT whose rows all use filter 0."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks = 8, {}
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        (crc,) = struct.unpack(">I", data[position + 8 + length : position + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF
        chunks[kind] = body
        position += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, colour) == (8, 2) and b"IEND" in chunks
    rows = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), np.uint8).reshape(height, -1)
    assert (rows[:, 0] == 0).all()
    return rows[:, 1:].reshape(height, width, 3)


def tone(hz: float, seconds: float = 1.0, level: float = 1.0) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (level * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def test_png_round_trips_an_image() -> None:
    image = np.random.default_rng(3).integers(0, 256, (7, 5, 3), dtype=np.uint8)
    assert (read_png(png(image)) == image).all()


def test_a_full_scale_waveform_spans_the_height_and_silence_is_a_line() -> None:
    loud = read_png(waveform_png(tone(200), width=100, height=40))
    ink = (loud != BACKGROUND).any(axis=2)
    assert loud.shape == (40, 100, 3)
    assert ink[0].any() and ink[-1].any()  # reaches +1 and -1
    quiet = read_png(waveform_png(np.zeros(RATE, np.float32), width=100, height=40))
    drawn_rows = np.flatnonzero((quiet != BACKGROUND).any(axis=(1, 2)))
    assert drawn_rows.tolist() == [20]  # one flat line at zero (the centre row)


def test_the_spectrogram_is_brightest_at_the_tones_frequency() -> None:
    picture = read_png(spectrogram_png(tone(3000), RATE, width=200)).astype(float)
    brightness = picture.sum(axis=2).mean(axis=1)  # per row, top = rate / 2
    expected_row = round((1 - 3000 / (RATE / 2)) * (SPECTRUM_HEIGHT - 1))
    assert abs(int(np.argmax(brightness)) - expected_row) <= 2


def test_decode_reads_a_stored_file_to_mono() -> None:
    buffer = io.BytesIO()
    soundfile.write(buffer, np.stack([tone(440), tone(440)], axis=1), RATE, format="WAV")
    samples, rate = decode(buffer.getvalue())
    assert rate == RATE and samples.ndim == 1 and samples.size == RATE
