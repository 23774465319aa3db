"""A job's text: what its text fields may hold, and how the model is to read `text`.

`markup` says how: `auto` (the default) reads SSML when the text has a `<speak>`, and its other
angle brackets as markup (control tags, `<break>`), refusing what is not supported; `plain`
reads every angle bracket as written (`text_markup.literal`, as a document sent as `plain`):
"List<String>", "<b>" or "<|user|>" are words to speak, never a tag or a special token. The
gate (`shared.jobs`) checks `text` read so, at the producer and again at the worker, and the
worker gives the engine exactly `model_text` of it.
"""

from __future__ import annotations

from typing import Literal

from pydantic_core import PydanticCustomError

from shared.invisible import strip_invisible
from shared.request_limits import RequestLimits
from shared.text_markup import (
    MarkupError,
    Segment,
    SpeechCount,
    is_ssml,
    literal,
    minimum_text_tokens,
    parse_markup,
    pause_seconds,
    refuse_control_characters,
    refuse_many_breaks,
    speech_limit_message,
)

TextMarkup = Literal["auto", "plain"]
PLAIN_HINT = ' (send markup "plain" to read its angle brackets as written)'


def rule(message: str) -> PydanticCustomError:
    """A field's broken rule, phrased "field: message" by `describe_errors`."""
    return PydanticCustomError("cosyq_rule", message)


def check_text_like(value: str, limit: int, *, required: bool) -> str:
    """`value` trimmed and without its invisible format characters (`shared.invisible`: the
    worker reads none of them), checked: not empty if `required`, at most `limit` characters,
    no control character, valid UTF-8."""
    value = strip_invisible(value).strip()
    if required and not value:
        raise rule("must not be empty (after trimming whitespace)")
    if len(value) > limit:
        raise rule(f"{len(value):,} characters, limit {limit:,}")
    try:
        refuse_control_characters(value)
    except MarkupError as e:
        raise rule(str(e)) from e
    _check_utf8(value)
    return value


def _check_utf8(value: str) -> None:
    """JSON can carry lone surrogates ("\\ud800"); no text stage or storage can."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise rule(f"not valid UTF-8 (unpaired surrogate at character {e.start})") from None


def model_text(text: str, markup: TextMarkup) -> str:
    """`text` as the engine is given it: under `plain`, every "<" that could open markup a
    character (the document's own `literal`), so nothing in it is a tag or a special token."""
    return literal(text) if markup == "plain" else text


def check_markup(text: str, markup: TextMarkup, limits: RequestLimits) -> str:
    """Refused markup in `text` read as `markup`, and the speech bound as far as it is known
    without the model: pauses exactly, CJK characters as the worker counts them
    (`text_markup.CJK_SECONDS_PER_CHARACTER`), the other words and numbers at their floor of
    one token each (`SpeechCount.floor_seconds`; the worker counts their real tokens).
    Returns `text` as written."""
    try:
        segments = parse_markup(model_text(text, markup), max_break_s=limits.max_break_seconds)
    except MarkupError as e:
        raise rule(f"{e}{plain_hint(text) if markup == 'auto' else ''}") from e
    try:
        refuse_many_breaks(segments, limits.max_breaks)
    except MarkupError as e:
        raise rule(str(e)) from e
    count, pauses = speech_floor(segments)
    estimate = count.floor_seconds(pauses)
    if estimate > limits.max_speech_seconds:
        if not count.cjk_characters:
            detail = f"at least {count.tokens:,} words or numbers and {pauses:g} s of pauses"
        else:
            words_s = f"at least {count.tokens:,} other words or numbers" if count.tokens else ""
            detail = count.describe(words_s, f"{pauses:g} s of pauses" if pauses else "")
        raise rule(speech_limit_message(estimate, limits.max_speech_seconds, detail))
    return text


def speech_floor(segments: list[Segment]) -> tuple[SpeechCount, float]:
    """What submit counts of parsed text (`SpeechCount.floor_seconds` of it is the estimate):
    its CJK characters, one token per other word or number, and its pauses."""
    words = " ".join(s for s in segments if isinstance(s, str))
    return SpeechCount.of(words, minimum_text_tokens), pause_seconds(segments)


def plain_hint(text: str) -> str:
    """For markup refused in a text read as `auto`: what to send when the same text is
    accepted as `plain` (its angle brackets as characters); empty when that would not help
    (SSML, whose tags are meant as markup; a control character)."""
    if is_ssml(text):
        return ""
    try:
        parse_markup(literal(text))
    except MarkupError:
        return ""
    return PLAIN_HINT
