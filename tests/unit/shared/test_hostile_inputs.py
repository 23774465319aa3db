"""The hostile-input corpus: what a hostile user sends, and the clear refusal each gets.

Every case is refused as InvalidRequestError naming the field and the rule, at the gate the
producer and the worker both run: control characters (C0, DEL, C1, CR, raw or as entities),
special tokens and elements written as SSML entities, booleans for numbers, a deep metadata
tree. The entity forms of every special token the tokenizer knows are in
tests/unit/engine/test_hostile_tokens.py (they need the tokenizer)."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from producer.cli import build_parser
from producer.http.errors import ApiError
from producer.http.speech import parse_speech
from shared.errors import InvalidRequestError
from shared.jobs import NUMERIC_FIELDS, RequestLimits, SynthesisRequest, validate_request
from shared.voices import check_transcript

LIMITS = RequestLimits()
TEXT_FIELDS = ("text", "prompt_text", "instruction", "transcript")
C0 = [chr(c) for c in range(0x20) if chr(c) not in "\t\n"]  # "\r" included
C1 = [chr(c) for c in range(0x80, 0xA0)]  # NEL (U+0085), CSI (U+009B) ...
CONTROLS = [*C0, "\x7f", *C1]


def refusal(field: str, value: Any) -> str | None:
    """The gate's message for `value` in `field` of an otherwise valid request, None if taken."""
    base: dict[str, Any] = {"text": "Hello.", "prompt_audio": "file:///p.wav", "prompt_text": "Hi."}
    if field == "instruction":
        base["mode"] = "instruct2"
    try:
        if field == "transcript":
            check_transcript(value, LIMITS.max_text_chars)
        else:
            validate_request({**base, field: value}, LIMITS)
    except InvalidRequestError as e:
        return str(e)
    return None


@pytest.mark.parametrize("char", CONTROLS, ids=lambda c: f"U+{ord(c):04X}")
@pytest.mark.parametrize("field", TEXT_FIELDS)
def test_control_characters_are_refused_in_every_text_field(field: str, char: str) -> None:
    if field == "text" and char == "\r":
        pytest.skip("a line end in text (test_crlf_and_cr_are_line_ends_in_text)")
    message = refusal(field, f"Hello {char}there.")
    assert message is not None and f"control character U+{ord(char):04X}" in message
    assert message.startswith(f"{field}: ")


@pytest.mark.parametrize("field", ["text", "prompt_text", "transcript"])
@pytest.mark.parametrize("reference", ["&#13;", "&#x0D;", "&#00013", "&#9;"])
def test_controls_decoded_from_ssml_entities_are_refused(field: str, reference: str) -> None:
    """html.unescape maps &#13; to CR (refused); a tab reference stays a tab (allowed). It
    maps C1 references to cp1252 (&#133; is "…") and drops other C0 ones."""
    message = refusal(field, f"<speak>Hello {reference} there.</speak>")
    if reference == "&#9;":
        assert message is None
    else:
        assert message is not None and "control character U+000D" in message


def test_crlf_and_cr_are_line_ends_in_text() -> None:
    """A job's text pasted from a file saved on Windows (CRLF, a BOM) is read as a document's
    is: it was refused ("contains control character U+000D") where the same text as a document
    was taken. Other fields are one line: a carriage return there is still refused."""
    for text in ("\ufeffFirst line.\r\nSecond line.\r\n", "First line.\rSecond line."):
        request = validate_request({"text": text}, LIMITS)
        assert request.text == "First line.\nSecond line."
    message = refusal("prompt_text", "First line.\r\nSecond line.")
    assert message == (
        "prompt_text: contains control character U+000D (only tab and newline are allowed)"
    )


@pytest.mark.parametrize("field", TEXT_FIELDS)
def test_tab_and_newline_are_allowed(field: str) -> None:
    assert refusal(field, "Hello\tthere.\nAgain.") is None


@pytest.mark.parametrize(
    "text",
    [
        "<speak>&lt;|endofprompt|&gt; hello</speak>",
        "<speak>&#60;|im_start|&#62;hello</speak>",
        "<speak>&#X3c;|im_end|&#x3E;</speak>",
        "<Speak>&LT;|endofprompt|&GT;</Speak>",
        "<speak>&amp;lt;|im_start|&amp;gt;</speak>",
        "<speak>&#38;#60;|im_start|&#38;#62;</speak>",
        "<</break>|im_start|>",
    ],
)
@pytest.mark.parametrize("field", ["text", "prompt_text", "transcript"])
def test_special_tokens_through_entities_are_refused_naming_them(field: str, text: str) -> None:
    message = refusal(field, text)
    assert message is not None and message.startswith(f"{field}: ")
    assert "special token <|" in message or "pauses are not allowed" in message


@pytest.mark.parametrize(
    "text",
    [
        '<speak>&lt;prosody rate="slow"&gt;hello&lt;/prosody&gt;</speak>',
        "<speak>&lt;say-as interpret-as='digits'&gt;12&lt;/say-as&gt;</speak>",
        "<speak>&amp;lt;b&amp;gt;bold</speak>",
    ],
)
def test_elements_written_as_entities_are_refused_not_read_aloud(text: str) -> None:
    message = refusal("text", text)
    assert message is not None and "written with XML entities is not supported" in message


def test_entities_that_make_plain_text_are_still_read() -> None:
    request = validate_request({"text": "<speak>Tom &amp; Jerry: 3 &lt; 4</speak>"}, LIMITS)
    assert request.text  # the words are decoded at the worker; nothing here is refused


def _is_numeric(annotation: Any) -> bool:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return all(type(arg) is int for arg in args)
    return any(arg in (int, float) for arg in (args or (annotation,)))


def test_every_numeric_field_is_listed_as_one() -> None:
    fields = SynthesisRequest.model_fields
    numeric = {name for name, info in fields.items() if _is_numeric(info.annotation)}
    assert numeric == set(NUMERIC_FIELDS)


@pytest.mark.parametrize("value", [True, False])
@pytest.mark.parametrize("field", NUMERIC_FIELDS)
def test_booleans_are_refused_for_numeric_fields(field: str, value: bool) -> None:
    message = refusal(field, value)
    assert message == f"{field}: must be a number, not {str(value).lower()}"


@pytest.mark.parametrize("value", [True, "1.5"])
def test_the_openai_speech_route_refuses_a_boolean_or_string_speed(value: Any) -> None:
    with pytest.raises(ApiError) as caught:
        parse_speech({"model": "tts-1", "input": "Hi.", "speed": value})
    assert caught.value.status == 400 and str(caught.value).startswith("speed: ")


@pytest.mark.parametrize(
    "argv",
    [
        ["result", "job", "--wait", "-3"],
        ["stream", "job", "--timeout", "-3", "--out", "x.wav"],
        ["say", "Hi.", "--timeout", "-3", "--out", "x.wav"],
        ["submit", "jobs.jsonl", "--wait", "--timeout", "nan"],
        ["voices", "add", "alice", "a.wav", "--timeout", "inf"],
        ["say", "Hi.", "--timeout", "soon", "--out", "x.wav"],
    ],
)
def test_negative_or_non_finite_timeouts_are_usage_errors(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(argv)
    assert caught.value.code == 2
    assert "seconds" in capsys.readouterr().err


@settings(max_examples=200, deadline=None)
@given(
    field=st.sampled_from(TEXT_FIELDS),
    before=st.text(max_size=8),
    char=st.sampled_from(CONTROLS),
    after=st.text(max_size=8),
)
def test_a_control_character_anywhere_is_refused(
    field: str, before: str, char: str, after: str
) -> None:
    assume(not (field == "text" and char == "\r"))  # a line end there
    value = f"x{before}{char}{after}x"
    message = refusal(field, value)
    assert message is not None and "control character U+" in message


def _nested(depth: int, kind: str) -> Any:
    root: Any = {} if kind == "dict" else []
    node = root
    for _ in range(depth - 1):
        child: Any = {} if kind == "dict" else []
        if kind == "dict":
            node["a"] = child
        else:
            node.append(child)
        node = child
    return root


@pytest.mark.parametrize("kind", ["dict", "list"])
@pytest.mark.parametrize("depth", [33, 300, 5000])
def test_deep_metadata_gets_one_short_specific_message(kind: str, depth: int) -> None:
    """Not pydantic's path through every level (1.9 KB), nor a RecursionError."""
    message = refusal("metadata", {"k": _nested(depth - 1, kind)})
    assert message == "metadata: nested more than 32 levels deep (COSYQ_MAX_METADATA_DEPTH)"


def test_metadata_up_to_the_depth_limit_is_taken_and_the_limit_is_a_setting() -> None:
    assert refusal("metadata", {"k": _nested(31, "dict")}) is None
    with pytest.raises(InvalidRequestError, match="nested more than 2 levels deep"):
        validate_request(
            {"text": "Hi.", "metadata": {"k": [[1]]}}, RequestLimits(max_metadata_depth=2)
        )


@pytest.mark.parametrize("field", ["text", "speed", "voice", "prompt_audio"])
def test_a_deep_value_in_another_field_is_refused_briefly(field: str) -> None:
    message = refusal(field, _nested(5000, "list"))
    assert message is not None and message.startswith(f"{field}: ") and len(message) < 200


def test_many_problems_are_counted_not_all_listed() -> None:
    message = refusal("metadata", {str(i): object() for i in range(50)})
    assert message is not None and message.endswith("; and 45 more") and len(message) < 600
