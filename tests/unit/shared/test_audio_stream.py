"""The audio stream's entry format: what the worker writes is what the producer reads."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import soundfile as sf

from producer.commands.stream import wav_header, write_wav_stream
from shared.audio_stream import (
    AudioChunk,
    StreamError,
    chunk_fields,
    error_fields,
    final_fields,
    from_pcm16,
    parse_entry,
    to_pcm16,
)


def raw(fields: dict[str, object]) -> dict[bytes, bytes]:
    """What redis-py hands back for an XADD of `fields`: bytes keys and values."""
    out = {}
    for key, value in fields.items():
        data = value if isinstance(value, bytes) else str(value).encode()
        out[key.encode()] = data
    return out


def test_pcm16_round_trip_clips_and_is_little_endian() -> None:
    samples = np.array([0.0, 0.5, -0.5, 1.0, -1.0, 2.0, -3.0], dtype=np.float32)
    pcm = to_pcm16(samples)
    assert struct.unpack("<7h", pcm) == (0, 16384, -16384, 32767, -32768, 32767, -32768)
    np.testing.assert_allclose(from_pcm16(pcm), np.clip(samples, -1, 1), atol=1 / 32768)


def test_pcm16_is_what_libsndfile_writes_to_a_16_bit_wav() -> None:
    samples = np.random.default_rng(0).uniform(-1.2, 1.2, 20000).astype(np.float32)
    file = io.BytesIO()
    sf.write(file, samples, 24000, format="WAV", subtype="PCM_16")
    stored, _ = sf.read(io.BytesIO(file.getvalue()), dtype="int16")
    np.testing.assert_array_equal(np.frombuffer(to_pcm16(samples), dtype="<i2"), stored)


def test_pcm16_matches_libsndfile_a_hair_either_side_of_every_step() -> None:
    """Small samples just below a step k / 32768 are where libsndfile's int32 rounding and a
    plain floor part (a streamed job once differed from its file by one LSB in one sample)."""
    steps = (np.arange(-32768, 32768) / 32768).astype(np.float32)
    below = np.nextafter(steps, np.float32(-2))
    samples = np.concatenate([steps, below, np.nextafter(below, np.float32(-2))])
    samples = np.concatenate([samples, np.nextafter(steps, np.float32(2))]).astype(np.float32)
    file = io.BytesIO()
    sf.write(file, samples, 24000, format="WAV", subtype="PCM_16")
    stored, _ = sf.read(io.BytesIO(file.getvalue()), dtype="int16")
    floor = np.clip(np.floor(samples * np.float32(32768)), -32768, 32767).astype(np.int16)
    assert (floor != stored).sum() > 100  # the cases exist: this test can fail
    np.testing.assert_array_equal(np.frombuffer(to_pcm16(samples), dtype="<i2"), stored)


def test_chunk_final_and_error_entries_parse_back() -> None:
    pcm = to_pcm16(np.linspace(-1, 1, 100, dtype=np.float32))
    chunk = parse_entry("1-0", raw(chunk_fields(0, 2, 16000, pcm)))
    assert isinstance(chunk, AudioChunk)
    assert (chunk.seq, chunk.attempt, chunk.sample_rate, chunk.final) == (0, 2, 16000, False)
    assert chunk.frames == 100 and chunk.samples().dtype == np.float32
    assert chunk.duration_s == pytest.approx(100 / 16000)
    final = parse_entry("2-0", raw(final_fields(1, 2, 16000, b"", uri="file:///x.wav", samples=9)))
    assert isinstance(final, AudioChunk) and final.final and final.uri == "file:///x.wav"
    error = parse_entry("3-0", raw(error_fields(2, 2, 16000, kind="storage", message="refused")))
    assert error == StreamError(seq=2, attempt=2, kind="storage", message="refused")
    with pytest.raises(ValueError, match="audio stream entry 4-0: malformed"):
        parse_entry("4-0", {b"seq": b"x"})


def test_wav_stream_is_valid_with_real_sizes_in_a_file_and_unknown_on_a_pipe() -> None:
    chunks = [
        AudioChunk(
            seq=i, sample_rate=22050, pcm=to_pcm16(np.full(n, 0.25, np.float32)), final=i == 1
        )
        for i, n in enumerate((300, 200))
    ]
    file = io.BytesIO()
    assert write_wav_stream(chunks, file, seekable=True) == 1000
    samples, rate = sf.read(io.BytesIO(file.getvalue()), dtype="int16")
    assert rate == 22050 and samples.shape == (500,) and (samples == 8192).all()
    pipe = io.BytesIO()
    write_wav_stream(chunks, pipe, seekable=False)
    assert pipe.getvalue()[:44] == wav_header(22050, None)
    assert struct.unpack("<I", pipe.getvalue()[40:44])[0] == 0xFFFFFFFF - 36
    assert pipe.getvalue()[44:] == file.getvalue()[44:]


def test_the_stream_field_is_a_strict_bool_and_needs_speed_one() -> None:
    from shared.errors import InvalidRequestError  # noqa: PLC0415
    from shared.jobs import RequestLimits, validate_request  # noqa: PLC0415

    assert validate_request({"text": "hi", "stream": True}, RequestLimits()).stream is True
    assert validate_request({"text": "hi"}, RequestLimits()).stream is False
    with pytest.raises(InvalidRequestError, match="stream: input should be a valid boolean"):
        validate_request({"text": "hi", "stream": "yes"}, RequestLimits())
    with pytest.raises(
        InvalidRequestError, match=r"speed: streaming needs speed 1\.0 \(got 1\.5\)"
    ):
        validate_request({"text": "hi", "stream": True, "speed": 1.5}, RequestLimits())
