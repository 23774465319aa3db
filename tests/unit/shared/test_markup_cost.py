"""What the markup gate costs is linear in the text, whatever a hostile user writes.

The front runs `parse_markup` on every paragraph of a document at submit (up to
COSYQ_MAX_DOCUMENT_CHARS, 1,000,000 characters): a rule that rescans the text once per some
character of it turns one request into minutes of the front's CPU, for every tenant. Each case
below took that long before; CPU seconds of this process are measured, so a busy machine does
not fail it."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.documents import DocumentLimits, validate_document
from shared.errors import InvalidRequestError
from shared.settings import Settings
from shared.text_markup import MAX_ENTITY_DEPTH, MarkupError, first_special_token, parse_markup

LAZY_TOKEN_RE = re.compile(r"<\|.*?\|>", re.DOTALL)  # the rule as a regex (what it replaced)
CPU_LIMIT_S = 2.0  # each case here takes milliseconds now; it took 15 s to minutes before


@contextmanager
def cpu_seconds_at_most(limit: float) -> Iterator[None]:
    start = time.process_time()
    yield
    spent = time.process_time() - start
    assert spent < limit, f"{spent:.1f} s of CPU, limit {limit} s"


@given(st.text(alphabet="<|>a\n", max_size=40))
def test_the_first_special_token_is_what_the_lazy_regex_finds(text: str) -> None:
    found = LAZY_TOKEN_RE.search(text)
    assert first_special_token(text) == (None if found is None else found.group())


@pytest.mark.parametrize(
    "text",
    [
        "<|" * 40_000,  # no "|>" anywhere: the regex scanned to the end from each "<|" (19 s)
        "<speak>" + "<|" * 40_000 + "</speak>",
    ],
    ids=["plain", "ssml"],
)
def test_many_token_openings_cost_one_pass(text: str) -> None:
    with cpu_seconds_at_most(CPU_LIMIT_S):
        assert parse_markup(text)


def test_a_token_closed_at_the_very_end_is_still_refused() -> None:
    named = re.escape("special token <|words <|")
    with cpu_seconds_at_most(CPU_LIMIT_S), pytest.raises(MarkupError, match=named):
        parse_markup("words <|" * 10_000 + " <|im_start|>")


def test_a_document_of_token_openings_is_answered_at_once() -> None:
    """Through the document gate, as the front runs it (80,000 characters of `<|`)."""
    limits = DocumentLimits.from_settings(Settings())
    with cpu_seconds_at_most(CPU_LIMIT_S), pytest.raises(InvalidRequestError, match="nothing"):
        validate_document({"text": "<|" * 40_000}, limits)


def nested(depth: int, inner: str) -> str:
    """`inner` behind `depth` levels of entities: "&amp;" * (depth - 1) + "lt;" is a "<"."""
    return "&" + "amp;" * (depth - 1) + inner


def test_entities_nested_past_the_limit_are_refused_at_once() -> None:
    """One decoding per level: 160,000 characters of `&amp;amp;...` took 13 s."""
    text = "<speak>" + nested(40_000, "lt;") + "</speak>"
    with cpu_seconds_at_most(CPU_LIMIT_S), pytest.raises(MarkupError, match="nested more than"):
        parse_markup(text)


def test_entities_nested_to_the_limit_are_still_checked() -> None:
    deepest = f"<speak>{nested(MAX_ENTITY_DEPTH, 'lt;')}|im_start|&gt;</speak>"
    with pytest.raises(MarkupError, match=re.escape("special token <|im_start|>")):
        parse_markup(deepest)
    with pytest.raises(MarkupError, match="nested more than"):
        parse_markup(f"<speak>{nested(MAX_ENTITY_DEPTH + 1, 'lt;')}|im_start|&gt;</speak>")
    assert parse_markup("<speak>AT&amp;amp;T</speak>") == [" AT&amp;T "]  # decoded once, read


def test_a_deeply_written_token_is_named_at_once() -> None:
    """The refusal names a raw `<|…|>` by its decodings: one per level was quadratic too
    (400,000 characters: 10 s)."""
    with cpu_seconds_at_most(CPU_LIMIT_S), pytest.raises(MarkupError, match="special token"):
        parse_markup("<|" + nested(100_000, "#105;m|>"))
