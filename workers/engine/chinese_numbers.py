"""A lone 2 in a Chinese text, written as a Mandarin listener expects it (二 or 两).

wetext's Chinese grammar picks 两 or 二 for a 2 by the character after it, and gets dates,
ordinals, clock hours and several measure words wrong: 3月2日 was 三月两日, 第2个 第两个,
2点 二点, 2次 二次, 2個 二個 (a traditional measure word). Mandarin says:

- a day of the month with 二, never 两: 3月2日 -> 三月二日 (after 月); a lone 2日 opening a
  clause or after 于, 至, 到, 和, 及, 或, 、 is a date too (于2日抵达, 2日，国务院...), unless a
  span of days follows (2日游, 2日内 stay 两日游, 两日内); 2月, 2号 wetext already reads 二;
- an ordinal with 二: 第2个 -> 第二个;
- a clock hour with 两: 2点, 2点半, 2点30分 -> 两点... (2點 -> 兩點; wetext reads 2:30 so
  already); a decimal written with 点 (2点5) is left to wetext;
- a count before a measure word with 两: 2次 2种 2台 2部 2间 2样 2晚 2份 2句 and the traditional
  forms (2個 2隻 2張 ...) -> 两 (兩 before a traditional form), unless 第 makes it an ordinal or
  a term follows (2次方 is 二次方, squared).

Only a 2 standing alone is rewritten (not 12, 2.5, 2022); what wetext reads right already
(2个 两个, 2月 二月, 2号 二号, 12日 十二日) is left to it. The 2 is written in Han before
wetext reads the span, which keeps a number written in Han as written.
"""

from __future__ import annotations

import re

_ALONE = r"(?<![0-9A-Za-z.,:/\-+])2(?![0-9.,:])"
# A day of the month: after 月, or a lone 2日 opening a clause or after a word that joins dates.
_DAY_RE = re.compile(
    rf"(?:^|(?<=月)|(?<=月\s)|(?<=[\s，。、；：！？,;:!?（(于至到和及或~～—－]))"
    rf"{_ALONE}(?=\s?[日])(?!\s?日(?:游|遊|内|內|以内|以內|之内|之內|间|間))"
)
_ORDINAL_RE = re.compile(rf"(?<=第){_ALONE}")
_CLOCK_RE = re.compile(rf"{_ALONE}(?=\s?(?P<word>[点點])(?:$|[^0-9]|\d{{1,2}}\s?分))")
# Measure words after which wetext writes 二 where Mandarin counts with 两 (it reads 个 只 本
# 位 张 条 件 ... right already); traditional forms are written 兩.
_SIMPLIFIED_MEASURES = "次种台部间样晚份句"
_TRADITIONAL_MEASURES = "個隻張條歲對雙種樣塊頁層間鐘臺"
_MEASURE_RE = re.compile(
    rf"(?<!第){_ALONE}(?=\s?(?P<word>[{_SIMPLIFIED_MEASURES}{_TRADITIONAL_MEASURES}]))"
    r"(?!\s?次(?:方|元|函|幂|冪))"
)


def _count(match: re.Match[str]) -> str:
    return "兩" if match["word"] in f"{_TRADITIONAL_MEASURES}點" else "两"


def mandarin(text: str) -> str:
    """`text` with each lone 2 that wetext misreads written 二 or 两 (the rules above)."""
    text = _DAY_RE.sub("二", text)
    text = _ORDINAL_RE.sub("二", text)
    text = _CLOCK_RE.sub(_count, text)
    return _MEASURE_RE.sub(_count, text)
