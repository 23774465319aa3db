"""Voice profiles as stored: JSON with base64 arrays (never pickle), checked when read back."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import subprocess
import sys
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import redis
import soundfile as sf

from shared import keys
from shared.errors import (
    InvalidRequestError,
    PromptAudioError,
    PromptSampleRateError,
    PromptUnreadableError,
    UnknownVoiceError,
    VoiceQuotaError,
)
from shared.voices import (
    VoiceProfile,
    VoiceRegistry,
    VoiceSummary,
    check_transcript,
    check_voice_name,
    decode_array,
    decode_prompt_audio,
    encode_array,
    load_voice,
    voice_exists,
)
from tests.doubles.audio_bombs import decoded_bytes, silent_flac

BOMB_MINUTES = 15  # of stereo 48 kHz silence: ~170 KB of FLAC, ~350 MB decoded
DECODE_PEAK_BYTES = 40 * 1024 * 1024  # what decoding a refused prompt may hold at most
REFUSALS = {True: r"900\.0 s, limit 30 s", False: "does not state its length"}


def profile(n: int = 3) -> VoiceProfile:
    rng = np.random.default_rng(0)
    summary = VoiceSummary(
        name="alice",
        transcript="Hello, I'm Alice. 你好",
        speech_tokens=n,
        source_sample_rate=44100,
        source_seconds=2.5,
        model_name="tiny",
        checkpoint_hash="0123456789abcdef",
        created_at="2026-01-01T00:00:00+00:00",
        source_uri="file:///tmp/alice.wav",
    )
    return VoiceProfile(
        summary=summary,
        speech_tokens=rng.integers(0, 6561, n).astype(np.int32),
        mel=rng.standard_normal((2 * n, 80)).astype(np.float32),
        embedding=rng.standard_normal(192).astype(np.float32),
    )


def stored(p: VoiceProfile) -> tuple[str, str]:
    return json.dumps(p.summary.to_dict()), p.arrays_json()


def test_round_trip_is_exact() -> None:
    original = profile()
    back = VoiceProfile.from_fields(*stored(original))
    assert back.summary == original.summary
    for name in ("speech_tokens", "mel", "embedding"):
        a, b = getattr(original, name), getattr(back, name)
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert back.mel.flags.writeable  # a copy, not a view of the decoded bytes


def test_arrays_are_base64_little_endian_with_shapes() -> None:
    doc = encode_array(np.array([[1, 2], [3, 258]], dtype=np.int32))
    assert doc["dtype"] == "int32" and doc["shape"] == [2, 2]
    assert base64.b64decode(doc["data"])[12:16] == bytes([2, 1, 0, 0])
    with pytest.raises(ValueError, match="only float32 and int32"):
        encode_array(np.zeros(2, dtype=np.float64))


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"dtype": "float64", "shape": [1], "data": ""}, "malformed array entry"),
        ({"dtype": "int32", "shape": [3], "data": base64.b64encode(b"1234").decode()}, "4 bytes"),
        ({"dtype": "int32", "shape": [1], "data": "***"}, "malformed array entry"),
        ({"shape": [1], "data": ""}, "malformed array entry"),
    ],
)
def test_malformed_arrays_are_named(doc: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        decode_array(doc, "mel")


def test_profiles_must_be_one_to_two() -> None:
    meta, arrays = stored(profile())
    docs = json.loads(arrays)
    docs["mel"] = encode_array(np.zeros((5, 80), dtype=np.float32))
    with pytest.raises(ValueError, match="not 1:2"):
        VoiceProfile.from_fields(meta, json.dumps(docs))
    newer = json.loads(meta) | {"format": 99}
    with pytest.raises(ValueError, match="format 99"):
        VoiceProfile.from_fields(json.dumps(newer), arrays)
    with pytest.raises(ValueError, match="unreadable JSON"):
        VoiceProfile.from_fields("{", arrays)


@pytest.mark.parametrize("name", ["", "bad name", "-x", "a" * 65, "é"])
def test_voice_names(name: str) -> None:
    with pytest.raises(InvalidRequestError, match="voice name"):
        check_voice_name(name)
    assert check_voice_name("Alice_2.v-1") == "Alice_2.v-1"


def test_unreadable_prompt_names_the_file() -> None:
    with pytest.raises(PromptUnreadableError, match=r"x\.mp3: not a readable audio file"):
        decode_prompt_audio(b"\x00" * 100, where="x.mp3", max_seconds=30)


@pytest.mark.parametrize("state_length", [True, False], ids=["stated", "unstated"])
def test_a_prompt_that_decompresses_to_gigabytes_is_refused_without_decoding_it(
    state_length: bool,
) -> None:
    bomb = silent_flac(BOMB_MINUTES * 60, state_length=state_length)
    assert decoded_bytes(BOMB_MINUTES * 60) > 1000 * len(bomb)
    tracemalloc.start()
    try:
        with pytest.raises(PromptAudioError, match=REFUSALS[state_length]):
            decode_prompt_audio(bomb, where="bomb.flac", max_seconds=30)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < DECODE_PEAK_BYTES, f"{peak:,} bytes held decoding a {len(bomb):,}-byte file"


def test_a_prompt_rate_above_192_khz_is_refused_before_decoding() -> None:
    buffer = io.BytesIO()
    sf.write(buffer, np.zeros(384000, dtype=np.float32), 384000, format="WAV")
    with pytest.raises(PromptSampleRateError, match="384000 Hz, at most 192000 Hz"):
        decode_prompt_audio(buffer.getvalue(), max_seconds=30)


def test_shared_voices_imports_without_torch() -> None:
    code = "import sys, shared.voices; print([m for m in ('torch', 'workers') if m in sys.modules])"
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_a_transcript_carries_control_tags_only() -> None:
    assert check_transcript("  Hi [laughter] there. ", 100) == "Hi [laughter] there."
    with pytest.raises(
        InvalidRequestError,
        match=r"transcript: contains the model's special token <\|endofprompt\|>",
    ):
        check_transcript("Hi<|endofprompt|>", 100)
    with pytest.raises(InvalidRequestError, match=r"transcript: .*pauses are not allowed here"):
        check_transcript('Hi <break time="1s"/> there', 100)
    with pytest.raises(InvalidRequestError, match="transcript: 12 characters, limit 5"):
        check_transcript("x" * 12, 5)


def test_a_jobs_voice_is_its_tenants_own_then_shared_never_anothers(redis_url: str) -> None:
    connection = redis.Redis.from_url(redis_url)
    for owner, words in (("alpha", "Alpha's."), (keys.SHARED_VOICES, "Shared.")):
        summary = dataclasses.replace(profile().summary, transcript=words)
        VoiceRegistry(connection, owner).save(dataclasses.replace(profile(), summary=summary))
    assert load_voice(connection, "alpha", "alice").summary.transcript == "Alpha's."
    assert load_voice(connection, "beta", "alice").summary.transcript == "Shared."
    assert voice_exists(connection, "beta", "alice")
    VoiceRegistry(connection, keys.SHARED_VOICES).remove("alice")
    with pytest.raises(UnknownVoiceError, match="no voice named 'alice'"):
        load_voice(connection, "beta", "alice")  # alpha's is never beta's
    assert not voice_exists(connection, "beta", "alice")
    assert [s.name for s in VoiceRegistry(connection, "alpha").summaries()] == ["alice"]
    with pytest.raises(InvalidRequestError, match="voice owner"):
        VoiceRegistry(connection, "Not A Tenant")
    connection.close()


@pytest.mark.parametrize("owner", ["alpha", keys.SHARED_VOICES])
def test_a_name_holding_an_owner_never_reaches_that_owners_voice(
    redis_url: str, owner: str
) -> None:
    """The tenant "default" keys its voices with no owner part (`cosyq:voice:<name>`): a name
    `alpha:alice` would be alpha's key. No voice can have it: it is nobody's voice."""
    connection = redis.Redis.from_url(redis_url)
    VoiceRegistry(connection, owner).save(profile())
    default = VoiceRegistry(connection, "default")
    for name in (f"{owner}:alice", f"{owner}:alice:x", ""):
        with pytest.raises(UnknownVoiceError, match="no voice named"):
            default.remove(name)
        with pytest.raises(UnknownVoiceError, match="no voice named"):
            default.load(name)
        with pytest.raises(UnknownVoiceError, match="no voice named"):
            load_voice(connection, "default", name)
        assert not voice_exists(connection, "default", name)
    assert VoiceRegistry(connection, owner).load("alice").name == "alice"
    assert VoiceRegistry(connection, owner).names() == ["alice"]
    connection.close()


def named(name: str) -> VoiceProfile:
    p = profile()
    return dataclasses.replace(p, summary=dataclasses.replace(p.summary, name=name))


def test_a_tenant_keeps_at_most_max_voices_and_may_still_replace_one(redis_url: str) -> None:
    connection = redis.Redis.from_url(redis_url)
    alpha = VoiceRegistry(connection, "alpha")
    for name in ("v0", "v1"):
        assert alpha.save(named(name), max_voices=2) is None
    with pytest.raises(VoiceQuotaError, match=r"tenant alpha has 2 voices \(quota max_voices 2"):
        alpha.save(named("v2"), max_voices=2)
    with pytest.raises(VoiceQuotaError):
        alpha.check_room("v2", 2)
    alpha.check_room("v0", 2)  # a replacement keeps the count
    assert alpha.save(named("v0"), max_voices=2) is not None
    VoiceRegistry(connection, "beta").save(named("v2"), max_voices=2)  # beta's count is its own
    alpha.remove("v1")
    alpha.save(named("v2"), max_voices=2)
    assert alpha.names() == ["v0", "v2"]
    connection.close()


def test_concurrent_saves_never_pass_max_voices(redis_url: str) -> None:
    """Every save reads the count under WATCH in its own transaction: however the threads
    interleave, exactly max_voices of the new names are stored and the rest refused."""
    names = [f"v{n}" for n in range(12)]
    outcomes: dict[str, str] = {}

    def save(name: str) -> None:
        connection = redis.Redis.from_url(redis_url)
        try:
            VoiceRegistry(connection, "alpha").save(named(name), max_voices=3)
            outcomes[name] = "stored"
        except VoiceQuotaError:
            outcomes[name] = "refused"
        finally:
            connection.close()

    threads = [threading.Thread(target=save, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    stored = sorted(name for name, outcome in outcomes.items() if outcome == "stored")
    assert len(outcomes) == len(names) and len(stored) == 3
    connection = redis.Redis.from_url(redis_url)
    assert VoiceRegistry(connection, "alpha").names() == stored
    connection.close()
