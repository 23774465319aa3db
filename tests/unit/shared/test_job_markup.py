"""A job's `markup`: `plain` reads every angle bracket of its text as written (as a document
sent as `plain` does), `auto` (the default) reads markup as before and, refusing a text that
`plain` would take, names `plain` in its reason."""

from __future__ import annotations

import pytest

from shared.errors import InvalidRequestError
from shared.job_text import model_text
from shared.jobs import RequestLimits, validate_request
from shared.text_markup import Pause, parse_markup, text_of

LIMITS = RequestLimits()
PROSE = "In Java a List<String> holds strings; <b>bold</b> is HTML, <|user|> a chat token."
HINT = 'send markup "plain" to read its angle brackets as written'


def rejected(payload: dict[str, object]) -> str:
    with pytest.raises(InvalidRequestError) as caught:
        validate_request(payload, LIMITS)
    return str(caught.value)


def test_plain_text_is_accepted_as_written_and_given_to_the_model_with_no_markup() -> None:
    request = validate_request({"text": PROSE, "markup": "plain"}, LIMITS)
    assert request.markup == "plain" and request.text == PROSE  # kept as written
    assert validate_request(request, LIMITS) == request  # the worker's gate takes it again
    spoken = model_text(request.text, request.markup)
    assert spoken == (
        "In Java a List< String> holds strings; < b>bold< /b> is HTML, < |user|> a chat token."
    )
    assert text_of(parse_markup(spoken)) == spoken  # words only: no tag, no token, no pause


def test_plain_reads_tags_and_breaks_as_words_never_as_control_tags_or_pauses() -> None:
    text = "Say <strong>this</strong> and <break time='3s'/> that."
    request = validate_request({"text": text, "markup": "plain"}, LIMITS)
    segments = parse_markup(model_text(request.text, request.markup))
    assert not any(isinstance(s, Pause) for s in segments)
    assert "<strong>" not in text_of(segments) and "< strong>" in text_of(segments)
    auto = parse_markup(validate_request({"text": text}, LIMITS).text)  # auto: as before
    assert Pause(3.0) in auto


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("A List<String> here.", "text: markup <String> is not supported"),
        ("The chat writes <|user|> first.", "text: contains the model's special token <|user|>"),
        ("Bold is <b>this</b>.", "text: markup <b> is not supported"),
    ],
)
def test_auto_still_refuses_and_its_reason_names_plain(text: str, rule: str) -> None:
    message = rejected({"text": text})
    assert message.startswith(rule) and message.endswith(f"({HINT})")
    assert rejected({"text": text, "markup": "auto"}) == message


@pytest.mark.parametrize(
    "text",
    [
        "<speak>Hello <prosody rate='slow'>x</prosody></speak>",  # SSML: its tags are markup
        "Hello\x1b[2J <b>there</b>.",  # a control character: plain refuses it too
    ],
)
def test_no_hint_where_plain_would_not_help(text: str) -> None:
    assert "plain" not in rejected({"text": text})


def test_plain_still_refuses_what_is_never_text() -> None:
    assert rejected({"text": "List<String>\x07", "markup": "plain"}).startswith(
        "text: contains control character U+0007"
    )
    assert rejected({"text": "a " * 600, "markup": "plain"}).startswith("text: about ")


@pytest.mark.parametrize("markup", ["markdown", "ssml", "PLAIN", 1, None])
def test_markup_is_auto_or_plain(markup: object) -> None:
    message = rejected({"text": "Hello.", "markup": markup})
    assert message.startswith("markup: input should be 'auto' or 'plain'")
    assert "text:" not in message  # the text is not judged by a markup that was refused
