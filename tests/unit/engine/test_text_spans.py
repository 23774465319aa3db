"""Spans of one script: the texts join back to the input, and digits and symbols between two
scripts go to the side the rule says."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workers.engine.normalizer import TextNormalizer, span_language
from workers.engine.text_spans import Span, split_spans


def cut(text: str) -> list[tuple[str, str | None]]:
    return [(span.text, span.script) for span in split_spans(text)]


@pytest.mark.parametrize(
    ("text", "spans"),
    [
        ("at 13:45 今天", [("at 13:45 ", "latin"), ("今天", "cjk")]),
        ("I was born in 1999年.", [("I was born in ", "latin"), ("1999年.", "cjk")]),
        ("今天是2024 and more", [("今天是2024 ", "cjk"), ("and more", "latin")]),
        ("Hello,你好", [("Hello,你好", "cjk")]),  # one word touching CJK text joins it
        ("Hello there,你好", [("Hello there,", "latin"), ("你好", "cjk")]),
        ("I was 1st, 今天", [("I was 1st, ", "latin"), ("今天", "cjk")]),
        ("1st今天", [("1st", "latin"), ("今天", "cjk")]),  # an ordinal ending stays English
        ("重5kg。", [("重5kg。", "cjk")]),
        ("他说 OK 3 次", [("他说 OK 3 次", "cjk")]),
        ("寿司 at 13:45", [("寿司 ", "cjk"), ("at 13:45", "latin")]),  # a space: not a unit
        ("2024", [("2024", None)]),
        ("", []),
    ],
)
def test_digits_and_symbols_go_where_the_rule_says(
    text: str, spans: list[tuple[str, str | None]]
) -> None:
    assert cut(text) == spans


@given(st.text(st.sampled_from("ab 1,.:¥年の。 \u00e9"), max_size=30))
def test_spans_join_back_to_the_text_and_alternate_scripts(text: str) -> None:
    spans = split_spans(text)
    assert "".join(span.text for span in spans) == text
    assert all(a.script != b.script for a, b in pairwise(spans))


def test_each_span_is_read_in_its_scripts_language() -> None:
    han, kana, latin = Span("今天", "cjk"), Span("今日は", "cjk"), Span("Hi", "latin")
    assert [span_language(s, "auto", "en") for s in (han, kana, latin)] == ["zh", "ja", "en"]
    assert [span_language(s, "ja", "ja") for s in (han, kana, latin)] == ["ja", "ja", "ja"]
    assert [span_language(s, "zh", "zh") for s in (han, kana, latin)] == ["zh", "ja", "zh"]
    assert span_language(Span("2024", None), "auto", "zh") == "zh"  # the whole text's, voice's


def test_a_symbol_wetext_cannot_read_costs_its_word_not_the_piece(
    caplog: pytest.LogCaptureFixture,
) -> None:
    normalize = TextNormalizer(enabled=True)
    text = "On 12/31/1999 I bought 2 ⊗5 things for $4.50 and 3 more."
    with caplog.at_level("WARNING", logger="workers.engine.normalizer"):
        spoken = normalize(text, "en")
    assert spoken == (
        "On the thirty first of december nineteen ninety nine I bought two ⊗ five things "
        "for four dollars and fifty cents and three more."
    )
    [record] = caplog.records
    assert record.getMessage().startswith("normalisation_span_failed kind=latin language=en")
    assert "⊗" not in record.getMessage() and "bought" not in record.getMessage()
