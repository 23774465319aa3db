"""Numbers in a Cantonese (`yue`) text, written as Cantonese speakers say them.

wetext has no Cantonese grammar: a `yue` text is read with the Chinese one, which writes the
numbers of written Mandarin. Upstream CosyVoice has no convention of its own here (its
frontend gives a Cantonese text to the same Chinese normaliser, the dialect asked for in the
instruction), so the rule is ours, kept to what spoken Cantonese always does and wetext never
writes, before wetext reads the span:

- 21-29 and 31-39 standing alone (a count, an age, a day, an ordinal after 第) as 廿 and 卅
  and the unit: 23 -> 廿三 (jaa6 saam1), 31 -> 卅一 (saa1 aa6 jat1); 20 and 30 stay 二十 and 三十,
  as said; a number with a decimal point, a unit in Latin letters, a percent or any other
  symbol after it, or more digits around it, is left to wetext (23.5, 23kg, 23%, 2023);
- 2 standing alone before a measure word as 兩 (loeng5): 2個 -> 兩個, 2點 -> 兩點 (wetext writes
  二点 for a clock's 2), unless 第 makes it an ordinal (第2個 is 第二個). A date's 2日 or 2月
  and 2年 (two years, or a second year of school) are not guessed.

A number written in Han characters is the writer's choice and is read as written.
"""

from __future__ import annotations

import re

_HAN_DIGITS = "零一二三四五六七八九"
# Before a measure word a lone 2 is 兩: people, things, times, clock hours, money (蚊, 毫).
_MEASURE_WORDS = (
    "個个隻只本次位張张條条件杯碗架部間间歲岁天晚份對对雙双種种樣样塊块蚊毫粒支枝封首篇句"
    "頁页層层座棵匹點点鐘钟"
)
_NOT_BEFORE = r"(?<![0-9A-Za-z.,:/\-+])"
# What may follow a number rewritten here: a Han character, CJK punctuation, a space, the end.
_FOLLOWED_BY = r"(?=[\u3400-\u9fff\u3000-\u303f\uff01-\uff0f\uff1a-\uff1f\s]|$)"
_TENS_RE = re.compile(rf"{_NOT_BEFORE}(?P<tens>[23])(?P<unit>[1-9]){_FOLLOWED_BY}")
_TWO_RE = re.compile(rf"(?<!第){_NOT_BEFORE}2(?=\s?[{_MEASURE_WORDS}])")


def _tens(match: re.Match[str]) -> str:
    return ("廿" if match["tens"] == "2" else "卅") + _HAN_DIGITS[int(match["unit"])]


def cantonese(text: str) -> str:
    """`text` with the numbers Cantonese says its own way written so (the rules above)."""
    return _TWO_RE.sub("兩", _TENS_RE.sub(_tens, text))
