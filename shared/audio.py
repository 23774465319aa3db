"""Audio in and out: encode samples to WAV/FLAC/OGG/MP3/Opus bytes, decode any file soundfile reads.

soundfile (libsndfile) does the codecs and soxr the resampling; no filter is written by hand.
"""

from __future__ import annotations

import hashlib
import io
import math
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


DECODE_BLOCK_SAMPLES = 1 << 20  # samples of all channels together decoded at a time (4 MiB)
UNKNOWN_FRAMES = 2**63 - 1  # libsndfile's frame count for a file that does not state it


def audio_header(data: bytes) -> tuple[int, int | None]:
    """(sample rate, frames) as the file's header states them (None: it does not, as a FLAC
    written by a streaming encoder), nothing decoded; AudioDecodeError for bytes no decoder
    accepts. The frames are the header's claim, which may be wrong."""
    try:
        info = sf.info(io.BytesIO(data))
    except (sf.SoundFileError, RuntimeError, TypeError) as e:
        raise _unreadable(e) from e
    frames = int(info.frames)
    return int(info.samplerate), None if frames == UNKNOWN_FRAMES else frames


def decode_audio(data: bytes, *, max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """Any file soundfile reads -> (mono float32 samples (N,), sample rate); channels averaged.

    Decoded a block at a time, each block mixed down as it comes, so memory follows the mono
    result, never the file's channel count. With `max_seconds` decoding stops one sample past
    it (a caller tells a longer file by the length it gets back): a well-compressed file (a
    FLAC of silence decodes to about 2,000 times its size) never decodes to more than that,
    whatever its header claims. Raises AudioDecodeError for bytes no decoder accepts.
    """
    try:
        with sf.SoundFile(io.BytesIO(data)) as audio:
            rate = int(audio.samplerate)
            limit = None if max_seconds is None else math.floor(max_seconds * rate) + 1
            mono = _read_mono(audio, limit)
    except (sf.SoundFileError, RuntimeError, TypeError) as e:
        raise _unreadable(e) from e
    if mono.shape[0] == 0:
        raise AudioDecodeError("the audio file holds no samples")
    return mono, rate


def _read_mono(audio: sf.SoundFile, limit: int | None) -> np.ndarray:
    """Up to `limit` frames (None: all) of `audio`, mixed down to mono block by block."""
    block = max(1, DECODE_BLOCK_SAMPLES // max(1, audio.channels))
    parts: list[np.ndarray] = []
    count = 0
    while limit is None or count < limit:
        wanted = block if limit is None else min(block, limit - count)
        samples = audio.read(wanted, dtype="float32", always_2d=True)
        if samples.shape[0] == 0:
            break
        mixed = samples.mean(axis=1, dtype=np.float32) if samples.shape[1] > 1 else samples[:, 0]
        parts.append(mixed)
        count += samples.shape[0]
    mono = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    return np.ascontiguousarray(mono, dtype=np.float32)


def _unreadable(error: Exception) -> AudioDecodeError:
    reason = getattr(error, "error_string", None) or str(error)
    return AudioDecodeError(f"not a readable audio file ({reason})")
