"""Cantonese (`yue`) numbers: 21-29 and 31-39 as 廿 and 卅 (23 廿三), a lone 2 before a measure
word as 兩 (2個 兩個, 2點 兩點); the rest as the Chinese grammar reads it. A yue text was read
wholly as written Mandarin: 今年23歲 was 今年二十三歲, 2點 二點."""

from __future__ import annotations

import pytest

from workers.engine.cantonese_numbers import cantonese
from workers.engine.normalizer import TextNormalizer


@pytest.fixture(scope="module")
def normalize() -> TextNormalizer:
    return TextNormalizer(enabled=True)


@pytest.mark.parametrize(
    ("text", "spoken"),
    [
        ("今年23歲，住在32號。", "今年廿三歲，住在卅二號。"),
        ("我有2個蘋果，佢有2隻貓。", "我有兩個蘋果，佢有兩隻貓。"),
        ("2點23分見。", "兩點廿三分見。"),
        ("2024年3月23日", "二零二四年三月廿三日"),
        ("第21名，第2個。", "第廿一名，第二個。"),  # 第 makes an ordinal: 二, never 兩
        ("價錢係39蚊。", "價錢係卅九蚊。"),
        ("20個人，30歲。", "二十個人，三十歲。"),  # round tens are said in full
        ("12個，123個，2023年。", "十二個，一百二十三個，二零二三年。"),
        ("23.5，23%，23kg。", "二十三点五，百分之二十三，二十三千克。"),  # left to wetext
        ("2月，2年級。", "二月，二年級。"),  # February and a second year are not 兩
        ("23", "廿三"),  # a text of no letters, read as Chinese
    ],
)
def test_yue_reads_numbers_as_cantonese_says_them(
    normalize: TextNormalizer, text: str, spoken: str
) -> None:
    assert normalize(text, "yue") == spoken


def test_zh_and_a_japanese_sentence_in_yue_text_are_unchanged(normalize: TextNormalizer) -> None:
    # zh: no 廿; 2個 is 兩個 by the Mandarin rule (`chinese_numbers`), not the Cantonese one
    assert normalize("今年23歲，2個。", "zh") == "今年二十三歲，兩個。"
    assert normalize("今年23歲。今日は23日です。", "yue") == "今年廿三歲。今日は二十三日です。"


def test_numbers_written_in_han_are_read_as_written() -> None:
    assert cantonese("二十三歲，兩個，第二十一") == "二十三歲，兩個，第二十一"
