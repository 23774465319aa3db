"""A paragraph of Chinese and Japanese sentences: each sentence in its own language. Any kana
made the whole paragraph Japanese, so a Chinese sentence's year 2024 was 二千二十四 (Japanese),
not 二零二四; a kanji-only sentence between Japanese ones stays Japanese."""

from __future__ import annotations

import pytest

from workers.engine.cjk_sentences import sentence_languages
from workers.engine.normalizer import TextNormalizer

ZH = "我们2024年去了东京。"
JA = "今日は2024年3月5日です。"
ZH_READ = "我们二零二四年去了东京。"
JA_READ = "今日は二千二十四年三月五日です。"


@pytest.fixture(scope="module")
def normalize() -> TextNormalizer:
    return TextNormalizer(enabled=True)


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        (ZH + JA, ZH_READ + JA_READ),
        (JA + ZH, JA_READ + ZH_READ),
        (JA + "他说，价格是3.5元。", JA_READ + "他说，价格是三点五元。"),
        ("他说：“很便宜。”それは2024年の話です。", "他说：“很便宜。”それは二千二十四年の話です。"),
    ],
)
def test_under_auto_each_sentence_is_read_in_its_language(
    normalize: TextNormalizer, text: str, spoken: str
) -> None:
    assert normalize(text, "auto") == spoken


def test_a_kanji_only_sentence_among_japanese_ones_stays_japanese(
    normalize: TextNormalizer,
) -> None:
    text = "東京都港区、2024年。" + JA
    assert normalize(text, "auto") == "東京都港区、二千二十四年。" + JA_READ
    # ... and follows the sentence before it once a Chinese sentence has been read
    assert sentence_languages(ZH + "北京大学2024年。" + JA, "auto") == [
        (ZH + "北京大学2024年。", "zh"),
        (JA, "ja"),
    ]


def test_zh_reads_every_sentence_without_kana_as_chinese_and_ja_every_one_as_japanese(
    normalize: TextNormalizer,
) -> None:
    text = "東京都港区、2024年。" + JA
    assert normalize(text, "zh") == "東京都港区、二零二四年。" + JA_READ
    assert normalize(ZH + JA, "ja") == "我们二千二十四年去了东京。" + JA_READ


@pytest.mark.parametrize("text", ["今天2024年。", JA, "東京都港区、2024年。", ""])
def test_a_span_of_one_language_stays_one_piece(text: str) -> None:
    pairs = sentence_languages(text, "auto")
    assert len(pairs) <= 1 and "".join(t for t, _ in pairs) == text


def test_the_sentences_join_back_to_the_span() -> None:
    text = f"{JA} {ZH}  東京。{JA}你好吗？"
    pairs = sentence_languages(text, "auto")
    assert "".join(t for t, _ in pairs) == text
    assert [lang for _, lang in pairs] == ["ja", "zh", "ja", "zh"]
