"""The request gate's promise, tested with generated input: any JSON, any Unicode (lone
surrogates included), any numbers either pass or raise InvalidRequestError, never anything else;
and what passes is safe for the stages after the gate (UTF-8 text, well-formed prompt URIs)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.errors import InvalidRequestError
from shared.jobs import RequestLimits, SynthesisRequest, validate_request
from shared.prompt_uris import PromptRoots, check_bucket_name, check_prompt_uri

LIMITS = RequestLimits()
FIELDS = sorted(SynthesisRequest.model_fields)
GATE = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Every code point, surrogates included (JSON's "\ud800" escapes decode to lone surrogates).
any_char = st.characters(codec=None, exclude_categories=())
any_text = st.text(any_char, max_size=40)
tricky_text = st.one_of(
    any_text,
    st.sampled_from(["", " ", "\ud800", "a\udfffb", "\x00", "\x1b[31m", "\u200b", "..", "/"]),
)
any_number = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, -1, 24000, 2**32, 10**400, 1e308, -0.0]),
)
scalars = st.one_of(st.none(), st.booleans(), any_number, tricky_text)
any_json = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(tricky_text, inner, max_size=4)
    ),
    max_leaves=12,
)
segment = st.one_of(
    st.sampled_from(["", ".", "..", "a", "voices", "p.wav", "%2e%2e", "a\\b", "x?y", "#"]),
    st.text(any_char, min_size=1, max_size=8),
)
path = st.lists(segment, min_size=0, max_size=5).map("/".join)
bucket = st.one_of(
    st.sampled_from(["bucket", "Bad_Bucket", "ab", "a" * 64, "192.168.0.1", "xn--b", "a..b"]),
    st.text(st.sampled_from("abc-.9_A"), max_size=12),
)
prompt_uri = st.one_of(
    st.builds(lambda p: f"file:///{p}", path),
    st.builds(lambda h, p: f"file://{h}/{p}", st.sampled_from(["", "localhost", "host"]), path),
    st.builds(lambda b, p: f"s3://{b}/{p}", bucket, path),
    tricky_text,
)
field_values: dict[str, st.SearchStrategy[Any]] = {
    "text": tricky_text,
    "prompt_audio": prompt_uri,
    "prompt_text": tricky_text,
    "instruction": tricky_text,
    "speed": any_number,
    "seed": any_number,
    "sample_rate": any_number,
    "metadata": any_json,
    "mode": st.sampled_from(["zero_shot", "cross_lingual", "instruct2", "other"]),
    "format": st.sampled_from(["wav", "flac", "ogg", "mp3"]),
}
near_valid = st.fixed_dictionaries(
    {"text": tricky_text},
    optional={name: field_values.get(name, any_json) for name in FIELDS if name != "text"},
)


def through_gate(payload: Any) -> SynthesisRequest | None:
    """The gate's answer: a request, or None for InvalidRequestError; anything else fails."""
    try:
        return validate_request(payload, LIMITS)
    except InvalidRequestError as e:
        assert_names_field_and_rule(str(e), payload)
        return None


def assert_names_field_and_rule(message: str, payload: Any) -> None:
    """`field: rule`, the field one the gate knows, the request itself, or the payload's own
    (unknown) key; the rule says something after the colon."""
    named = [*FIELDS, "request", *(payload if isinstance(payload, dict) else ())]
    field = next(
        (
            n
            for n in named
            if isinstance(n, str) and any(message.startswith(f"{n}{x}") for x in (": ", ".", "["))
        ),
        None,
    )
    assert field is not None, f"names no field: {message!r}"
    assert ": " in message and message.split(": ", 1)[1].strip(), f"names no rule: {message!r}"


@GATE
@given(st.one_of(any_json, st.dictionaries(st.sampled_from(FIELDS) | any_text, any_json)))
def test_any_json_passes_or_is_rejected(payload: Any) -> None:
    through_gate(payload)


@GATE
@given(near_valid)
def test_near_valid_requests_pass_or_are_rejected_and_what_passes_is_safe(
    payload: dict[str, Any],
) -> None:
    request = through_gate(payload)
    if request is None:
        return
    for text in (request.text, request.prompt_text, request.instruction):
        if text is not None:
            text.encode("utf-8")  # every later stage can handle it
    json.dumps(request.model_dump(mode="json"), allow_nan=False).encode("utf-8")
    if request.prompt_audio is not None:
        check_prompt_uri(request.prompt_audio)
        assert ".." not in request.prompt_audio.split("/")
        roots = PromptRoots(("/srv/prompts", "s3://bucket/voices"))
        try:
            roots.check(request.prompt_audio)
        except InvalidRequestError as e:
            assert "COSYQ_PROMPT_ROOTS" in str(e)


@GATE
@given(prompt_uri)
def test_prompt_uris_pass_or_raise_value_error(uri: str) -> None:
    try:
        check_prompt_uri(uri)
    except ValueError as e:
        assert len(str(e).strip()) > 10, f"says nothing of what is wrong: {e!r}"


@GATE
@given(bucket)
def test_bucket_names_follow_the_s3_rules(name: str) -> None:
    try:
        check_bucket_name(name)
    except ValueError:
        return
    assert 3 <= len(name) <= 63 and name == name.lower() and "_" not in name
    assert name[0].isalnum() and name[-1].isalnum() and ".." not in name
