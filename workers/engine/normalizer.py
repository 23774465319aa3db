"""Text normalisation: numbers, dates, units and symbols spelled out as read, per span of text.

wetext (grammars shipped in the wheel, offline) does the work, with these corrections:
- Language per span: a text is cut into spans by script (`text_spans`: CJK or Latin letters,
  digits and symbols going with a neighbour by the rule written there) and each span is read
  in its own language: a CJK span Japanese if it holds kana or the request says ja, else
  Chinese, sentence by sentence where a span with kana holds a Chinese sentence
  (`cjk_sentences`); a Latin span in the request's language if it names one, else English;
  a text with no letters in the request's language, else the voice transcript's, else
  English. So a Chinese date no longer makes an English sentence's "1st" "一秒t". (wetext's
  own `auto` reads a text of only digits as Chinese.)
- Failures per span: wetext raises when no grammar path fits (one "₹500" in a paragraph).
  The span is then cut in halves, down to single words and runs of digits, each normalised
  alone: only what wetext cannot read is left as written, and the log says which span kind
  failed (`normalisation_span_failed`, never the text).
- Invisible format characters (zero width space, joiners outside emoji, word joiner, an
  inner byte order mark, soft hyphen: `shared.invisible`) are dropped first, even with
  normalisation off: they are never speech, and split a word for the tokenizer.
- Cantonese (`yue`, read with the Chinese grammar): numbers spoken Cantonese's own way are
  written so first (`cantonese_numbers`: 23 廿三, 2個 兩個).
- Width forms are folded first (`fold_widths`: "ｺｰﾋｰ", "１２３", vertical "︒").
- Symbols it reads wrong or not at all are rewritten first (`spoken_symbols`).
- Chinese: a lone 2 is written 二 or 两 as Mandarin says it first (`chinese_numbers`: 3月2日
  三月二日, 第2个 第二个, 2点 两点), wetext's choice depending only on the next character.
- Korean: wetext has no grammar for it (its English one read "3,500원" "three thousand five
  hundred 원"); a span whose words are mostly Hangul has its numbers written out in Hangul
  (`korean_numbers`) and is not given to wetext.
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
import threading
import unicodedata
from typing import Any, Literal

from shared.invisible import strip_invisible
from shared.text_markup import CONTROL_TAG_RE
from workers.engine.cantonese_numbers import cantonese
from workers.engine.cjk_sentences import sentence_languages
from workers.engine.korean_numbers import HANGUL_RE, korean
from workers.engine.spoken_symbols import REWRITES
from workers.engine.text_spans import HAN_RE, Span, japanese_kana, split_spans

Language = Literal["en", "zh", "ja"]
LANGUAGES: tuple[Language, ...] = ("en", "zh", "ja")
DEFAULT_LANGUAGE: Language = "en"
# The request's languages wetext has no grammar for: Cantonese is written in Han and read as
# Chinese; Korean is read by script (its Hangul spans by `korean_numbers`, a stretch of no
# letters too).
READ_AS: dict[str, str] = {"yue": "zh", "ko": "auto"}
_LETTER_RE = re.compile(r"[^\W\d_]")
_CJK_PUNCTUATION_RE = re.compile("[\u3000-\u303f\uff01\uff0c\uff1a\uff1b\uff1f]")
_SPACES_RE = re.compile(r"\s+")
# Full-width 0-9 A-Z a-z, half-width katakana and punctuation, vertical and small CJK forms.
_WIDTH_FORMS_RE = re.compile(
    "[\uff10-\uff19\uff21-\uff3a\uff41-\uff5a\uff61-\uff9f\ufe10-\ufe19\ufe30-\ufe4f]+"
)
_WORD_RE = re.compile(r"[^\W\d_]+")  # a run of letters (a Hangul word: of syllables)
_HANGUL_WORD_RE = re.compile(HANGUL_RE.pattern + "+")
# Chinese and Japanese write no spaces between words: drop one between two such characters.
_CJK = "\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef"  # radicals..CJK ideographs, kana, full-width
_CJK_GAP_RE = re.compile(f"(?<=[{_CJK}]) (?=[{_CJK}])")
_EXTRA_ESCAPE_RE = re.compile(r"\\([\"\\])")
_ESCAPE_PROBE = '1 "'  # normalised in every language (a digit), with a quote to see escaped
_CLAUSE_END = frozenset(",.;:!?，。；：！？、")
_DIGIT_RUN_RE = re.compile(r"\d+(?:[.,:/]\d+)*|\D+")

log = logging.getLogger(__name__)


def detect_language(text: str) -> Language | None:
    """The language a text's script says (kana: ja, Han: zh, other letters: en, no letters
    but CJK punctuation: zh); None for a text of digits and symbols only."""
    if japanese_kana(text):
        return "ja"
    if HAN_RE.search(text):
        return "zh"
    if _LETTER_RE.search(text):
        return "en"
    if _CJK_PUNCTUATION_RE.search(text):  # "12 × 4 = 48。"
        return "zh"
    return None


def choose_language(requested: str, text: str, transcript: str = "") -> Language:
    """The request's language, or for "auto" the text's, the transcript's, then English."""
    requested = READ_AS.get(requested, requested)
    if requested in LANGUAGES:
        return requested
    if requested != "auto":
        raise ValueError(f"language: {requested!r} is not auto, en, zh, ja, ko or yue")
    return detect_language(text) or detect_language(transcript) or DEFAULT_LANGUAGE


def span_language(span: Span, requested: str, no_letters: Language) -> Language:
    """The language one span is read in (the rule in this module's docstring)."""
    if span.script == "cjk":
        return "ja" if requested == "ja" or span.kana else "zh"
    if span.script == "latin":
        return requested if requested in LANGUAGES else DEFAULT_LANGUAGE
    return no_letters


def fold_widths(text: str) -> str:
    """Full-width digits and Latin letters, half-width katakana and CJK vertical punctuation as
    their ordinary forms (NFKC): "ｺｰﾋｰ" is "コーヒー", "１２３" "123", "︒" "。". The tokenizer
    only composes (NFC), so the model was given the rare forms, which wetext reads less well."""
    return _WIDTH_FORMS_RE.sub(lambda m: unicodedata.normalize("NFKC", m.group()), text)


def _mostly_hangul(text: str) -> bool:
    """True when most of a span's words are Hangul (a Korean sentence naming "Kubernetes";
    not an English one quoting one Korean word)."""
    hangul = len(_HANGUL_WORD_RE.findall(text))
    return hangul > 0 and 2 * hangul >= len(_WORD_RE.findall(text))


def _korean_span(text: str) -> str:
    """A Korean span with its numbers in Hangul, keeping a space on each side if it had one."""
    spoken = _SPACES_RE.sub(" ", korean(text.strip())).strip()
    lead = " " if text[:1].isspace() else ""
    tail = " " if text[-1:].isspace() and spoken else ""
    return lead + spoken + tail


def _middle_space(text: str) -> int | None:
    """A space to cut a failed text at: nearest the middle, one after a clause's punctuation
    if there is any (a date or an amount is less often cut)."""
    spaces = [i for i, c in enumerate(text) if c == " "]
    after_clause = [i for i in spaces if i and text[i - 1] in _CLAUSE_END]
    candidates = after_clause or spaces
    if not candidates:
        return None
    return min(candidates, key=lambda i: abs(i - len(text) // 2))


# wetext keeps its grammars in module globals loaded on first use, and its thread safety is not
# documented: a batching worker prepares texts on a preparation thread while a streamed job's
# text is prepared on the model thread, so one call at a time, process-wide.
_WETEXT_LOCK = threading.Lock()


class _Wetext:
    """One wetext normaliser for one language, with its extra escape level undone."""

    def __init__(self, language: Language) -> None:
        from wetext import Normalizer  # noqa: PLC0415 (only when normalisation is on)

        self.normalizer: Any = Normalizer(lang=language, operator="tn")
        self.double_escapes = '\\"' in str(self.normalizer.normalize(_ESCAPE_PROBE))

    def __call__(self, text: str) -> str:
        with _WETEXT_LOCK:
            spoken = str(self.normalizer.normalize(text))
        return _EXTRA_ESCAPE_RE.sub(r"\1", spoken) if self.double_escapes else spoken


class TextNormalizer:
    """Normalised text, each span in its language (wetext), or whitespace clean-up only when
    disabled."""

    def __init__(self, *, enabled: bool = True, kept: re.Pattern[str] = CONTROL_TAG_RE) -> None:
        """`kept`: the tags passed through as written (CosyVoice 3: its pronunciation tokens
        too)."""
        self.enabled = enabled
        self.kept = kept
        self._wetext: dict[Language, _Wetext] = {}

    def _for(self, language: Language) -> _Wetext:
        with _WETEXT_LOCK:
            if language not in self._wetext:
                self._wetext[language] = _Wetext(language)
            return self._wetext[language]

    def __call__(
        self, text: str, language: str = "auto", *, no_letters: Language | None = None
    ) -> str:
        """`text` with whitespace collapsed and, between control tags, spelled out. `language`
        is the request's (auto, en, zh, ja); `no_letters` the language of a stretch with no
        letters (default: `choose_language` of this text)."""
        text = _SPACES_RE.sub(" ", strip_invisible(text)).strip()
        asked = language  # ko and yue read their own numbers (`_stretch`)
        language = READ_AS.get(language, language)
        no_letters = no_letters or choose_language(language, text)
        if not self.enabled or not text:
            return text
        text = fold_widths(text)
        parts: list[str] = []
        position = 0
        for tag in self.kept.finditer(text):
            stretch = text[position : tag.start()]
            parts.append(self._stretch(stretch, language, no_letters, asked))
            parts.append(tag.group())
            position = tag.end()
        parts.append(self._stretch(text[position:], language, no_letters, asked))
        return _CJK_GAP_RE.sub("", "".join(parts)).strip()

    def _stretch(self, text: str, requested: str, no_letters: Language, asked: str = "") -> str:
        """One stretch between tags, span by span; a span of mostly Hangul is Korean, which
        wetext has no grammar for: its numbers are written out in Hangul (`korean_numbers`), as
        is a stretch of no letters in a text `asked` as ko. In a text asked as yue the numbers of
        a Chinese sentence and of a stretch of no letters are first written as Cantonese says
        them (`cantonese_numbers`: 23 廿三, 2個 兩個)."""
        parts = []
        for span in split_spans(text):
            if (span.script == "latin" and _mostly_hangul(span.text)) or (
                span.script is None and asked == "ko"
            ):
                parts.append(_korean_span(span.text))
            elif span.script == "cjk":  # by sentence where Chinese and Japanese mix
                for sentence, language in sentence_languages(span.text, requested):
                    cantonese_zh = asked == "yue" and language == "zh"
                    written = cantonese(sentence) if cantonese_zh else sentence
                    parts.append(self._span(written, language, span.script))
            elif span.script is None and asked == "yue":
                parts.append(self._span(cantonese(span.text), no_letters, span.script))
            else:
                read_in = span_language(span, requested, no_letters)
                parts.append(self._span(span.text, read_in, span.script))
        return "".join(parts)

    def _span(self, text: str, language: Language, kind: str | None) -> str:
        """Normalise one span, keeping a space on each side if it had one."""
        core = text.strip()
        if not core:
            return " " if text else ""
        written = REWRITES[language](core)
        try:
            spoken = self._for(language)(written)
        except Exception as e:  # wetext raises plain errors when no grammar path fits
            log.warning(
                "normalisation_span_failed kind=%s language=%s chars=%d error=%s",
                kind or "no_letters",
                language,
                len(core),
                type(e).__name__,
            )
            spoken = self._isolated(written, language)
        spoken = _SPACES_RE.sub(" ", spoken).strip() or core
        lead = " " if text[:1].isspace() else ""
        tail = " " if text[-1:].isspace() else ""
        return lead + spoken + tail

    def _tried(self, text: str, language: Language) -> str:
        try:
            return self._for(language)(text)
        except Exception:  # the span's failure is logged once, by _span
            return self._isolated(text, language)

    def _isolated(self, text: str, language: Language) -> str:
        """wetext failed on `text`: each half normalised alone, down to single words, then to
        runs of digits and of other characters; what still fails is kept as written."""
        cut = _middle_space(text)
        if cut is not None:
            return f"{self._tried(text[:cut], language)} {self._tried(text[cut + 1 :], language)}"
        runs = _DIGIT_RUN_RE.findall(text)
        if len(runs) > 1:
            return " ".join(self._tried(run, language) for run in runs)
        return text
