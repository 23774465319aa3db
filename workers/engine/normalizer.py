"""Text normalisation: numbers, dates, units and symbols spelled out as read, per language.

wetext (grammars shipped in the wheel, offline) does the work, with three corrections:
- Language: wetext's own `auto` reads any text without CJK letters as English except a text of
  only digits, which it reads as Chinese ("2024" -> "两千零二十四"). We choose the language
  from the request (`choose_language`): given, else the text's script, else the voice
  transcript's, else English.
- Escaping: wetext 0.1's token parser keeps the tagger's backslash escapes in each value and its
  serialiser escapes the value again, so the verbaliser, which undoes one level, leaves `\\"`
  for every `"` and `\\\\` for every `\\`. We detect that once per language (a probe) and undo
  the extra level, so every character comes out as it went in.
- Control tags ([laughter], <strong> ...) are kept verbatim; normalisation runs on the text
  between them, so one tag no longer switches normalisation off for the whole text.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Literal

from shared.text_markup import CONTROL_TAG_RE

Language = Literal["en", "zh", "ja"]
LANGUAGES: tuple[Language, ...] = ("en", "zh", "ja")
DEFAULT_LANGUAGE: Language = "en"
_KANA_RE = re.compile("[\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f]")
_HAN_RE = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_LETTER_RE = re.compile(r"[^\W\d_]")
_SPACES_RE = re.compile(r"\s+")
# Chinese and Japanese write no spaces between words: drop one between two such characters.
_CJK = "\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef"  # radicals..CJK ideographs, kana, full-width
_CJK_GAP_RE = re.compile(f"(?<=[{_CJK}]) (?=[{_CJK}])")
_EXTRA_ESCAPE_RE = re.compile(r"\\([\"\\])")
_ESCAPE_PROBE = '1 "'  # normalised in every language (a digit), with a quote to see escaped

log = logging.getLogger(__name__)


def detect_language(text: str) -> Language | None:
    """The language a text's script says (kana: ja, Han: zh, other letters: en); None for a
    text with no letters (digits, symbols)."""
    if _KANA_RE.search(text):
        return "ja"
    if _HAN_RE.search(text):
        return "zh"
    if _LETTER_RE.search(text):
        return "en"
    return None


def choose_language(requested: str, text: str, transcript: str = "") -> Language:
    """The request's language, or for "auto" the text's, the transcript's, then English."""
    if requested in LANGUAGES:
        return requested
    if requested != "auto":
        raise ValueError(f"language: {requested!r} is not auto, en, zh or ja")
    return detect_language(text) or detect_language(transcript) or DEFAULT_LANGUAGE


class _Wetext:
    """One wetext normaliser for one language, with its extra escape level undone."""

    def __init__(self, language: Language) -> None:
        from wetext import Normalizer  # noqa: PLC0415 (only when normalisation is on)

        self.normalizer: Any = Normalizer(lang=language, operator="tn")
        self.double_escapes = '\\"' in str(self.normalizer.normalize(_ESCAPE_PROBE))

    def __call__(self, text: str) -> str:
        spoken = str(self.normalizer.normalize(text))
        return _EXTRA_ESCAPE_RE.sub(r"\1", spoken) if self.double_escapes else spoken


class TextNormalizer:
    """Normalised text per language (wetext), or whitespace clean-up only when disabled."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._wetext: dict[Language, _Wetext] = {}

    def _for(self, language: Language) -> _Wetext:
        if language not in self._wetext:
            self._wetext[language] = _Wetext(language)
        return self._wetext[language]

    def __call__(self, text: str, language: Language = DEFAULT_LANGUAGE) -> str:
        """`text` with whitespace collapsed and, between control tags, spelled out."""
        text = _SPACES_RE.sub(" ", text).strip()
        if not self.enabled or not text:
            return text
        parts: list[str] = []
        position = 0
        for tag in CONTROL_TAG_RE.finditer(text):
            parts.append(self._words(text[position : tag.start()], language))
            parts.append(tag.group())
            position = tag.end()
        parts.append(self._words(text[position:], language))
        return _CJK_GAP_RE.sub("", "".join(parts)).strip()

    def _words(self, text: str, language: Language) -> str:
        """Normalise one stretch between tags, keeping a space on each side if it had one."""
        core = text.strip()
        if not core:
            return " " if text else ""
        try:
            spoken = self._for(language)(core)
        except Exception as e:  # wetext raises plain errors when no grammar path fits
            log.warning("normalisation_skipped language=%s error=%s", language, type(e).__name__)
            spoken = core
        spoken = _SPACES_RE.sub(" ", spoken).strip() or core
        lead = " " if text[:1].isspace() else ""
        tail = " " if text[-1:].isspace() else ""
        return lead + spoken + tail
