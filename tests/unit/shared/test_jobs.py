"""The job contract: every validation rule, named by field and rule, and the valid shapes."""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import InvalidRequestError
from shared.jobs import (
    SUPPORTED_SAMPLE_RATES,
    RequestLimits,
    SynthesisRequest,
    validate_request,
)
from shared.settings import load_settings

LIMITS = RequestLimits()
FILE_PROMPT = "file:///srv/prompts/alice.wav"


def check(**fields: Any) -> SynthesisRequest:
    return validate_request({"text": "Hello there.", **fields}, LIMITS)


def rejected(payload: dict[str, Any], limits: RequestLimits = LIMITS) -> str:
    with pytest.raises(InvalidRequestError) as caught:
        validate_request(payload, limits)
    return str(caught.value)


# (fields added to {"text": "Hello there."}, the exact "field: rule" message expected)
INVALID: list[tuple[dict[str, Any], str]] = [
    ({"text": "   \n\t "}, "text: must not be empty (after trimming whitespace)"),
    ({"text": "x" * 2314}, "text: 2,314 characters, limit 2,000"),
    ({"text": "bell\x07"}, "text: contains control character U+0007"),
    ({"text": 42}, "text: input should be a valid string"),
    ({"schema_version": 2}, "schema_version: input should be 1 (got 2)"),
    ({"colour": "blue"}, "colour: unknown field"),
    ({"voice": "../alice"}, "voice: 1-64 letters, digits, '_', '.' or '-', starting with"),
    ({"voice": "a" * 65}, "voice: 1-64 letters"),
    ({"prompt_audio": "/srv/alice.wav", "prompt_text": "hi"}, "prompt_audio: must be a file://"),
    ({"prompt_audio": "http://x/a.wav", "prompt_text": "hi"}, "prompt_audio: must be a file://"),
    ({"prompt_audio": "file://srv/a.wav", "prompt_text": "hi"}, "a file URI needs an absolute"),
    ({"prompt_audio": "s3://bucket", "prompt_text": "hi"}, "an s3 URI needs a bucket and a key"),
    ({"prompt_audio": FILE_PROMPT}, "prompt_text: required by mode zero_shot with prompt_audio"),
    ({"prompt_text": "hi"}, "prompt_text: only used with prompt_audio"),
    ({"voice": "alice", "prompt_audio": FILE_PROMPT, "prompt_text": "hi"}, "voice: give either"),
    ({"prompt_audio": FILE_PROMPT, "prompt_text": "  "}, "prompt_text: must not be empty"),
    ({"mode": "clone"}, "mode: input should be 'zero_shot', 'cross_lingual' or 'instruct2'"),
    ({"mode": "instruct2"}, "instruction: required by mode instruct2"),
    ({"instruction": "calmly"}, "instruction: only used by mode instruct2 (mode is zero_shot)"),
    ({"mode": "instruct2", "instruction": "y" * 2001}, "instruction: 2,001 characters, limit"),
    ({"speed": 0.49}, "speed: 0.49 is outside 0.5-2.0"),
    ({"speed": 2.01}, "speed: 2.01 is outside 0.5-2.0"),
    ({"speed": float("nan")}, "speed: nan is outside 0.5-2.0"),
    ({"speed": "fast"}, "speed: input should be a valid number"),
    ({"seed": -1}, "seed: -1 is outside 0-4,294,967,295"),
    ({"seed": 2**32}, "seed: 4294967296 is outside 0-4,294,967,295"),
    ({"seed": "7"}, "seed: input should be a valid integer (got '7')"),
    ({"seed": "http://u:pw-9@h/"}, "seed: input should be a valid integer (got 'http://u:***@h/')"),
    ({"seed": True}, "seed: must be a number, not true"),
    ({"speed": True}, "speed: must be a number, not true"),
    (
        {"format": "aac"},
        "format: input should be 'wav', 'flac', 'ogg', 'mp3' or 'opus' (got 'aac')",
    ),
    (
        {"format": "opus", "sample_rate": 22050},
        "sample_rate: format opus takes 8000, 16000, 24000,",
    ),
    ({"format": "mp3", "sample_format": "float32"}, "sample_format: float32 needs format wav"),
    ({"sample_format": "pcm24"}, "sample_format: input should be 'pcm16' or 'float32'"),
    ({"format": "flac", "sample_format": "float32"}, "sample_format: float32 needs format wav"),
    ({"sample_rate": 11025}, "sample_rate: 11025 Hz is not supported; use one of 8000, 16000"),
    ({"sample_rate": 24000.0}, "sample_rate: input should be a valid integer"),
    ({"output_key": "a/b.wav", "format": "flac"}, "output_key: ends in .wav but format is flac"),
    ({"idempotency_key": ""}, "idempotency_key: 0 characters, must be 1-255"),
    ({"idempotency_key": "k" * 256}, "idempotency_key: 256 characters, must be 1-255"),
    ({"idempotency_key": "a\nb"}, "idempotency_key: must be printable characters only"),
    ({"priority": "urgent"}, "priority: input should be 'high', 'default' or 'low'"),
    ({"metadata": {"blob": "x" * 5000}}, "metadata: 5,011 bytes as JSON, limit 4,096"),
    ({"metadata": ["not", "an", "object"]}, "metadata: input should be a valid dictionary"),
]


@pytest.mark.parametrize(("fields", "message"), INVALID)
def test_each_rule_names_field_and_rule(fields: dict[str, Any], message: str) -> None:
    assert message in rejected({"text": "Hello there.", **fields})


OUTPUT_KEY_ESCAPES = [
    ("../etc/passwd", "'..' and '.' segments are not allowed"),
    ("a/../../b", "'..' and '.' segments are not allowed"),
    ("a/./b", "'..' and '.' segments are not allowed"),
    ("..", "'..' and '.' segments are not allowed"),
    ("/etc/passwd", "must be a relative key, not an absolute path"),
    ("~/x", "must be a relative key, not an absolute path"),
    ("C:/Windows/x", "must be a relative key, not an absolute path"),
    ("a\\..\\b", "backslashes are not allowed"),
    ("a//b", "empty segments"),
    ("a/b/", "empty segments"),
    ("", "must not be empty"),
    ("a/b?c", "only letters, digits"),
    ("a b", "only letters, digits"),
    ("a/\x00b", "only letters, digits"),
    ("k" * 513, "513 characters, limit 512"),
]


@pytest.mark.parametrize(("key", "message"), OUTPUT_KEY_ESCAPES)
def test_output_key_escapes_are_rejected(key: str, message: str) -> None:
    assert f"output_key: {message}" in rejected({"text": "hi", "output_key": key})


def test_several_problems_are_all_reported() -> None:
    message = rejected({"text": "", "speed": 9, "format": "aac"})
    assert "text: must not be empty" in message
    assert "speed: 9.0 is outside" in message
    assert "format: input should be" in message


def test_text_never_echoed_in_errors() -> None:
    secret = "my secret sentence " * 200
    assert "secret" not in rejected({"text": secret})
    assert "secret" not in rejected({"text": [secret]})


def test_limits_come_from_settings() -> None:
    limits = RequestLimits.from_settings(
        load_settings(env_file=None, max_text_chars=10, max_metadata_bytes=8)
    )
    assert "text: 11 characters, limit 10" in rejected({"text": "x" * 11}, limits)
    assert "metadata: 9 bytes" in rejected({"text": "hi", "metadata": {"ab": 12}}, limits)
    validate_request({"text": "x" * 10, "metadata": {"a": 1}}, limits)


def test_not_an_object() -> None:
    assert rejected(["text"]) == "request: must be a JSON object (got list)"  # type: ignore[arg-type]


def test_defaults_and_trimming() -> None:
    request = check(text="  Hello there.\n")
    assert request.text == "Hello there."
    assert (request.voice, request.prompt_audio, request.mode) == (None, None, "zero_shot")
    assert (request.format, request.sample_format, request.sample_rate) == ("wav", "pcm16", 24000)
    assert (request.speed, request.seed, request.priority) == (1.0, None, "default")
    assert request.metadata == {} and request.schema_version == 1


@pytest.mark.parametrize(
    "fields",
    [
        {"voice": "alice"},
        {"voice": "default", "mode": "cross_lingual"},
        {"prompt_audio": FILE_PROMPT, "prompt_text": "This is Alice."},
        {"prompt_audio": "s3://voices/alice/prompt.flac", "prompt_text": "This is Alice."},
        {"prompt_audio": FILE_PROMPT, "mode": "cross_lingual"},
        {"prompt_audio": FILE_PROMPT, "mode": "instruct2", "instruction": "Speak slowly."},
        {"voice": "alice", "mode": "instruct2", "instruction": "用开心的语气说"},
        {"speed": 0.5, "seed": 0},
        {"speed": 2.0, "seed": 2**32 - 1},
        {"format": "flac", "sample_rate": 48000},
        {"format": "ogg", "sample_rate": 8000},
        {"format": "mp3", "sample_rate": 44100},
        {"format": "opus", "sample_rate": 48000},
        {"output_key": "calls/42.opus", "format": "opus"},
        {"format": "wav", "sample_format": "float32"},
        {"output_key": "customers/42/greeting"},
        {"output_key": "a/b-c_d.e=f+g@h,i.wav"},
        {"idempotency_key": "order-42:line-7", "priority": "high"},
        {"metadata": {"order": 42, "tags": ["a", "b"], "nested": {"x": None}}},
    ],
)
def test_valid_requests(fields: dict[str, Any]) -> None:
    request = check(**fields)
    assert validate_request(request.model_dump(mode="json"), LIMITS) == request


@pytest.mark.parametrize("rate", SUPPORTED_SAMPLE_RATES)
def test_every_supported_rate(rate: int) -> None:
    assert check(sample_rate=rate).sample_rate == rate


def test_request_is_frozen_and_round_trips_through_json() -> None:
    request = check(seed=3, metadata={"k": "v"})
    with pytest.raises(ValueError, match="frozen"):
        request.speed = 2.0  # type: ignore[misc]
    assert SynthesisRequest.model_validate_json(request.model_dump_json()) == request
