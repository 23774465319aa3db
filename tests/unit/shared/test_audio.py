"""Audio encoding: each format and rate reads back with soundfile at the right rate and length."""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pytest
import soundfile as sf

from shared.audio import decode_audio, encode_audio, resample
from shared.errors import AudioDecodeError
from shared.jobs import OPUS_SAMPLE_RATES, SUPPORTED_SAMPLE_RATES

RATE = 24000


def tone(seconds: float = 1.5, freq: float = 440.0, amplitude: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * RATE)) / RATE
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    noise = reference - test
    return float(10 * np.log10(np.sum(reference**2) / max(np.sum(noise**2), 1e-20)))


CASES = [
    ("wav", "pcm16", "WAV", "PCM_16"),
    ("wav", "float32", "WAV", "FLOAT"),
    ("flac", "pcm16", "FLAC", "PCM_16"),
    ("ogg", "pcm16", "OGG", "VORBIS"),
    ("mp3", "pcm16", "MP3", "MPEG_LAYER_III"),
    ("opus", "pcm16", "OGG", "OPUS"),
]
CONTENT_TYPES = {"mp3": "audio/mpeg", "opus": "audio/ogg; codecs=opus"}
# Every format at every rate the contract allows with it (opus has no 22.05/44.1 kHz: test_jobs).
CASES_AT_RATES = [
    (*case, rate)
    for case in CASES
    for rate in (OPUS_SAMPLE_RATES if case[0] == "opus" else SUPPORTED_SAMPLE_RATES)
]


@pytest.mark.parametrize(("fmt", "sample_format", "container", "subtype", "rate"), CASES_AT_RATES)
def test_format_reads_back_at_rate_and_length(
    fmt: str, sample_format: str, container: str, subtype: str, rate: int
) -> None:
    samples = tone()
    encoded = encode_audio(samples, RATE, fmt, rate, sample_format)  # type: ignore[arg-type]
    info = sf.info(io.BytesIO(encoded.data))
    assert (info.format, info.subtype, info.channels) == (container, subtype, 1)
    assert info.samplerate == rate
    expected_frames = round(samples.size * rate / RATE)
    assert info.frames == expected_frames == encoded.frames
    assert encoded.duration_s == pytest.approx(1.5, abs=1e-3)
    assert encoded.content_type == CONTENT_TYPES.get(fmt, f"audio/{fmt}")
    assert encoded.extension == fmt
    decoded, decoded_rate = decode_audio(encoded.data)
    assert decoded_rate == rate and decoded.shape == (expected_frames,)
    assert decoded.dtype == np.float32


@pytest.mark.parametrize(
    ("fmt", "sample_format", "min_snr"),
    [
        ("wav", "pcm16", 80.0),
        ("wav", "float32", 200.0),
        ("flac", "pcm16", 80.0),
        ("ogg", "pcm16", 20.0),
        ("mp3", "pcm16", 10.0),
        ("opus", "pcm16", 10.0),
    ],
)
def test_native_rate_keeps_the_signal(fmt: str, sample_format: str, min_snr: float) -> None:
    samples = tone()
    decoded, _ = decode_audio(encode_audio(samples, RATE, fmt, None, sample_format).data)  # type: ignore[arg-type]
    assert snr_db(samples, decoded) > min_snr


def test_resampling_keeps_a_tone_in_band() -> None:
    down = resample(tone(freq=1000.0), RATE, 16000)
    t = np.arange(down.size) / 16000
    assert (
        snr_db((0.5 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32)[200:-200], down[200:-200])
        > 40
    )


def test_pcm_clips_instead_of_wrapping_and_float_keeps_range() -> None:
    loud = np.array([1.5, -1.5, 0.25] * 100, dtype=np.float32)
    pcm, _ = decode_audio(encode_audio(loud, RATE, "wav").data)
    assert pcm.max() == pytest.approx(1.0, abs=1e-4) and pcm.min() == pytest.approx(-1.0, abs=1e-4)
    flt, _ = decode_audio(encode_audio(loud, RATE, "wav", sample_format="float32").data)
    assert flt.max() == pytest.approx(1.5)


def test_sha256_matches_the_bytes() -> None:
    encoded = encode_audio(tone(0.1), RATE, "flac")
    assert encoded.sha256 == hashlib.sha256(encoded.data).hexdigest()


@pytest.mark.parametrize(
    ("samples", "message"),
    [
        (np.zeros((10, 2), np.float32), "expected mono samples"),
        (np.zeros(0, np.float32), "expected mono samples"),
        (np.array([0.0, np.nan], np.float32), "NaN or infinity"),
    ],
)
def test_bad_samples_are_refused(samples: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        encode_audio(samples, RATE, "wav")


def test_float_only_with_wav() -> None:
    with pytest.raises(ValueError, match="cannot encode flac with sample format float32"):
        encode_audio(tone(0.1), RATE, "flac", sample_format="float32")


def test_decode_averages_channels_and_rejects_garbage() -> None:
    stereo = np.stack([tone(0.2), np.zeros(int(0.2 * RATE), np.float32)], axis=1)
    buffer = io.BytesIO()
    sf.write(buffer, stereo, 16000, format="WAV", subtype="FLOAT")
    mono, rate = decode_audio(buffer.getvalue())
    assert rate == 16000 and np.allclose(mono, stereo[:, 0] / 2)
    with pytest.raises(
        AudioDecodeError, match=r"not a readable audio file \(Format not recognised"
    ):
        decode_audio(b"definitely not audio" * 20)
