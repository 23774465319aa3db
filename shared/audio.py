"""Audio in and out: encode samples to WAV/FLAC/OGG/MP3/Opus bytes, decode any file soundfile reads.

soundfile (libsndfile) does the codecs and soxr the resampling; no filter is written by hand.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass

import numpy as np
import soundfile as sf

from shared.errors import AudioDecodeError
from shared.results import AudioFormat, SampleFormat

CONTENT_TYPES: dict[str, str] = {
    "wav": "audio/wav",
    "flac": "audio/flac",
    "ogg": "audio/ogg",  # Vorbis in Ogg
    "mp3": "audio/mpeg",
    "opus": "audio/ogg; codecs=opus",  # Opus in Ogg (RFC 7845)
}

# (soundfile format, subtype) per request format and sample format.
_CODECS: dict[tuple[str, str], tuple[str, str]] = {
    ("wav", "pcm16"): ("WAV", "PCM_16"),
    ("wav", "float32"): ("WAV", "FLOAT"),
    ("flac", "pcm16"): ("FLAC", "PCM_16"),
    ("ogg", "pcm16"): ("OGG", "VORBIS"),
    ("mp3", "pcm16"): ("MP3", "MPEG_LAYER_III"),  # libsndfile >= 1.1 (lame, mpg123)
    ("opus", "pcm16"): ("OGG", "OPUS"),
}


def soundfile_codecs() -> dict[tuple[str, str], tuple[str, str]]:
    """(format, sample format) -> (soundfile format, subtype): what libsndfile must offer."""
    return dict(_CODECS)


RESAMPLE_QUALITY = "HQ"  # soxr's high quality: flat to 0.95 Nyquist, far below PCM16 noise


@dataclass(frozen=True)
class EncodedAudio:
    """An encoded file, ready for storage."""

    data: bytes
    sample_rate: int
    frames: int
    duration_s: float
    content_type: str
    extension: str
    sha256: str


def resample(samples: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """Mono float32 samples (N,) at from_rate -> (M,) at to_rate, M = round(N * to / from)."""
    if from_rate == to_rate:
        return samples
    import soxr  # noqa: PLC0415 (only when a rate differs: not at each worker's start)

    resampled = soxr.resample(samples, from_rate, to_rate, quality=RESAMPLE_QUALITY)
    return np.asarray(resampled, dtype=np.float32)


def encode_audio(
    samples: np.ndarray,
    sample_rate: int,
    fmt: AudioFormat,
    target_rate: int | None = None,
    sample_format: SampleFormat = "pcm16",
) -> EncodedAudio:
    """Encode mono float32 samples (N,) in [-1, 1], resampling to target_rate when given.

    PCM and Vorbis output is clipped to [-1, 1] (libsndfile would wrap, not clip); float32 WAV
    keeps the samples as they are.
    """
    codec = _CODECS.get((fmt, sample_format))
    if codec is None:
        raise ValueError(f"cannot encode {fmt} with sample format {sample_format}")
    samples = np.asarray(samples, dtype=np.float32)
    if samples.ndim != 1 or samples.size == 0:
        raise ValueError(f"expected mono samples of shape (N,), N > 0; got {samples.shape}")
    if not np.isfinite(samples).all():
        raise ValueError("samples contain NaN or infinity")
    rate = target_rate or sample_rate
    samples = resample(samples, sample_rate, rate)
    if sample_format != "float32":
        samples = np.clip(samples, -1.0, 1.0)
    buffer = io.BytesIO()
    sf.write(buffer, samples, rate, format=codec[0], subtype=codec[1])
    data = buffer.getvalue()
    return EncodedAudio(
        data=data,
        sample_rate=rate,
        frames=int(samples.shape[0]),
        duration_s=samples.shape[0] / rate,
        content_type=CONTENT_TYPES[fmt],
        extension=fmt,
        sha256=hashlib.sha256(data).hexdigest(),
    )


def decode_audio(data: bytes) -> tuple[np.ndarray, int]:
    """Any file soundfile reads -> (mono float32 samples (N,), sample rate); channels averaged.

    Raises AudioDecodeError for bytes no decoder accepts.
    """
    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (sf.SoundFileError, RuntimeError, TypeError) as e:
        reason = getattr(e, "error_string", None) or str(e)
        raise AudioDecodeError(f"not a readable audio file ({reason})") from e
    if samples.shape[0] == 0:
        raise AudioDecodeError("the audio file holds no samples")
    mono = samples.mean(axis=1, dtype=np.float32) if samples.shape[1] > 1 else samples[:, 0]
    return np.ascontiguousarray(mono, dtype=np.float32), int(rate)
