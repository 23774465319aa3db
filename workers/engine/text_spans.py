"""A mixed-script text cut into spans, each read in one language.

A span is a run of letters of one script, with the digits, symbols, punctuation and spaces
between them: CJK (Han and kana together) or Latin (every other letter: Latin, Cyrillic,
Greek, Hangul ...). Digits and symbols between two scripts are shared by one rule:

- up to and including the last space among them they go with the text on the left
  ("at 13:45 今天": "13:45" is English);
- what follows that space, touching the next letter, goes with the text on the right, since a
  number written against a word is that word's count or unit ("in 1999年", "5kg", "1st");
  punctuation at its start stays on the left ("Hello,你好");
- at the start of the text they go with the first span, at its end with the last.

One Latin word between two CJK runs, or at the text's start or end touching a CJK run through
digits and symbols without a space, is part of the CJK span, with the numbers beside it: a
unit ("重5kg", "333mです") or a name ("我用iPhone 15拍的", "他说 OK 3 次") read in the CJK
text's language. An English ordinal ending ("1st") stays Latin.
A text with no letters at all is one span of no script.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal

Script = Literal["latin", "cjk"]
KANA_RE = re.compile("[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
HAN_RE = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3005\u3007]")


@dataclass(frozen=True)
class Span:
    """One stretch of the text and the script of its letters (None: it has none)."""

    text: str
    script: Script | None

    @property
    def kana(self) -> bool:
        return japanese_kana(self.text)


# What says a CJK text is Japanese: kana, but not the katakana middle dot (Chinese writes
# foreign names with it, "迈克尔・杰克逊"), nor kana inside Chinese title marks or quotes
# (a Chinese sentence naming 《となりのトトロ》 is Chinese: its "2001年" is 二零零一年).
_JAPANESE_KANA_RE = re.compile(
    "[\u3041-\u3096\u309d-\u309f\u30a1-\u30fa\u30fc-\u30ff\u31f0-\u31ff\uff66-\uff9d]"
)
_CHINESE_QUOTED_RE = re.compile("《[^》]*》|〈[^〉]*〉|“[^”]*”")


def japanese_kana(text: str) -> bool:
    """True when `text` has kana outside Chinese title marks and quotes (`_JAPANESE_KANA_RE`)."""
    return bool(_JAPANESE_KANA_RE.search(_CHINESE_QUOTED_RE.sub("", text)))


def script_of(char: str) -> Script | None:
    """The script a character's letter belongs to; None for digits, symbols, spaces."""
    if HAN_RE.match(char) or KANA_RE.match(char):
        return "cjk"
    if unicodedata.category(char)[0] == "L":
        return "latin"
    return None


Run = tuple[int, int, Script]
_ORDINAL_ENDINGS = frozenset({"st", "nd", "rd", "th"})


def _merged(runs: list[Run]) -> list[Run]:
    """Neighbouring runs of the same script as one (with what lies between them)."""
    merged: list[Run] = []
    for start, end, script in runs:
        if merged and merged[-1][2] == script:
            merged[-1] = (merged[-1][0], end, script)
        else:
            merged.append((start, end, script))
    return merged


def _embedded(text: str, runs: list[Run], index: int) -> bool:
    """True for a one-word Latin run between two CJK runs, or at the text's edge touching
    (through digits and symbols, no space) the CJK run beside it."""
    start, end, script = runs[index]
    word = text[start:end]
    if script != "latin" or any(c.isspace() for c in word):
        return False
    if word.lower() in _ORDINAL_ENDINGS and text[start - 1 : start].isdigit():
        return False
    before = runs[index - 1] if index else None
    after = runs[index + 1] if index + 1 < len(runs) else None
    if before and after:
        return before[2] == after[2] == "cjk"
    if before:
        return not any(c.isspace() for c in text[before[1] : start])
    if after:
        return not any(c.isspace() for c in text[end : after[0]])
    return False


def _letter_runs(text: str) -> list[Run]:
    """(start, end, script) of each run of letters of one script, neighbours of the same
    script merged with what lies between them, a Latin word among CJK text made CJK."""
    runs = _merged([(i, i + 1, s) for i, c in enumerate(text) if (s := script_of(c))])
    embedded = [
        (start, end, "cjk" if _embedded(text, runs, i) else script)
        for i, (start, end, script) in enumerate(runs)
    ]
    return _merged(embedded)


def _cut(text: str, left_end: int, right_start: int) -> int:
    """Where the digits and symbols text[left_end:right_start] split between two scripts."""
    between = text[left_end:right_start]
    spaces = [i for i, c in enumerate(between) if c.isspace()]
    cut = left_end + spaces[-1] + 1 if spaces else left_end
    while cut < right_start and unicodedata.category(text[cut])[0] == "P":
        cut += 1
    return cut


def split_spans(text: str) -> list[Span]:
    """`text` as consecutive spans (their texts join to `text`), by the rule above."""
    runs = _letter_runs(text)
    if not runs:
        return [Span(text, None)] if text else []
    spans: list[Span] = []
    start = 0
    for (_, end, script), (next_start, _, _) in pairwise(runs):
        cut = _cut(text, end, next_start)
        spans.append(Span(text[start:cut], script))
        start = cut
    spans.append(Span(text[start:], runs[-1][2]))
    return spans
