"""A long caption cut into cues a viewer can read: at most two lines of 42 characters (84, the
broadcast norm), or 24 Chinese, Japanese or Korean characters (two lines of 12; a full-width
character is read as slowly as ~3.5 Latin ones), a mix in proportion.

A cue was a whole piece of text, up to the ~80 tokens the model speaks at once: ~100 Chinese
characters on screen for 20 s. A longer cue is cut where its text breaks most naturally:
after a sentence's end (。！？ and their ASCII forms, `shared.sentences`), then after a clause
mark (，、；： , ; :), then between words, then between characters (Chinese and Japanese write
no spaces: into parts of even width); the parts are packed greedily into cues within the
bound. Each cue gets the share of the piece's time its speech takes (`SpeechCount`: 0.2 s a
Han character or Hangul syllable, 0.125 s a kana, 0.3 s a word of the rest), so cues follow
the voice.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable

from shared.sentences import split_sentences
from shared.text_markup import SpeechCount, minimum_text_tokens

# A cue's width in units: a full-width character 7, any other 2, at most 168 (84 Latin, 24 CJK).
CUE_LATIN_CHARS = 84
CUE_CJK_CHARS = 24
_WIDE_UNITS, _NARROW_UNITS = 7, 2
CUE_UNITS = CUE_LATIN_CHARS * _NARROW_UNITS  # 168 = CUE_CJK_CHARS * _WIDE_UNITS
_CLAUSE_RE = re.compile(r"(?<=[,，、;；:：])")
_WORD_RE = re.compile(r"(?<=\s)(?=\S)")


def cue_units(text: str) -> int:
    """A text's width in cue units (the module's measure); surrounding spaces not counted."""
    return sum(
        _WIDE_UNITS if unicodedata.east_asian_width(c) in "WF" else _NARROW_UNITS
        for c in text.strip()
    )


def _clauses(text: str) -> list[str]:
    return [part for part in _CLAUSE_RE.split(text) if part]


def _words(text: str) -> list[str]:
    return [part for part in _WORD_RE.split(text) if part]


def _characters(text: str) -> list[str]:
    """An unbroken run cut between characters into the fewest parts within the bound, of even
    widths (27 characters as 14 and 13, not 24 and a dangling 3)."""
    parts = math.ceil(cue_units(text) / CUE_UNITS)
    cuts, width, part = [], 0, 1
    for index, char in enumerate(text):
        width += cue_units(char)
        if part < parts and width * parts >= part * cue_units(text):
            cuts.append(index + 1)
            part += 1
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True) if text[a:b]]


_BREAKERS: tuple[Callable[[str], list[str]], ...] = (split_sentences, _clauses, _words, _characters)


def _pack(parts: list[str]) -> list[str]:
    chunks: list[str] = []
    for part in parts:
        if chunks and cue_units(chunks[-1] + part) <= CUE_UNITS:
            chunks[-1] += part
        else:
            chunks.append(part)
    return chunks


def _fit(text: str, level: int = 0) -> list[str]:
    """`text` as consecutive parts within the bound, broken as coarsely as possible."""
    if level == len(_BREAKERS) or cue_units(text) <= CUE_UNITS:
        return [text]
    parts = [fitted for part in _BREAKERS[level](text) for fitted in _fit(part, level + 1)]
    return _pack(parts)


def _speech_s(text: str) -> float:
    return SpeechCount.of(text, minimum_text_tokens).seconds()


def cut_caption(text: str, start_s: float, end_s: float) -> list[tuple[float, float, str]]:
    """(start, end, text) of each cue `text` is cut into, sharing start_s..end_s by speech."""
    texts = [part.strip() for part in _fit(text.strip()) if part.strip()]
    if len(texts) <= 1:
        return [(start_s, end_s, text)]
    weights = [_speech_s(part) for part in texts]
    if not sum(weights):
        weights = [float(len(part)) for part in texts]
    total, done, cues = sum(weights), 0.0, []
    for part, weight in zip(texts, weights, strict=True):
        begin = start_s + (end_s - start_s) * done / total
        done += weight
        cues.append((begin, start_s + (end_s - start_s) * done / total, part))
    return cues
