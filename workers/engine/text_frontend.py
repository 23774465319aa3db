"""Text side of the front end: normalisation (wetext), splitting into pieces, Qwen2 token ids.

Normalisation spells out numbers, dates, units and symbols the way they are read ("$4.50" ->
"four point five dollars", "2024年" -> "二零二四年"), with wetext (grammars shipped in the wheel,
offline). As upstream does, it is skipped for a text carrying special tokens (both "<|" and
"|>"), for the instruction of instruct2, and when the `normalize_text` setting is off (text
already written out as it should be spoken). The TTS text is then split into pieces
(`text_split`) and each piece tokenized; the prompt transcript is normalised but never split.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from shared.errors import EmptyTextError
from workers.engine.text_split import SENTENCE_END, SplitConfig, split_text
from workers.model.tokenizer import END_OF_PROMPT, TextTokenizer

SPECIAL_OPEN, SPECIAL_CLOSE = "<|", "|>"
_SPACES_RE = re.compile(r"\s+")
# Chinese and Japanese write no spaces between words: drop one between two such characters.
_CJK = "\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef"  # radicals..CJK ideographs, kana, full-width
_CJK_GAP_RE = re.compile(f"(?<=[{_CJK}]) (?=[{_CJK}])")
_CJK_CHAR_RE = re.compile(f"[{_CJK}]")


def has_special_tokens(text: str) -> bool:
    return SPECIAL_OPEN in text and SPECIAL_CLOSE in text


def is_cjk(char: str) -> bool:
    return _CJK_CHAR_RE.fullmatch(char) is not None


def speakable(text: str) -> bool:
    """True if `text` holds a letter or digit (a piece of only punctuation is dropped)."""
    return any(unicodedata.category(c)[0] in ("L", "N") for c in text)


class TextNormalizer:
    """wetext text normalisation (language detected per text), or pass-through."""

    def __init__(self, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self._normalizer = None
        if enabled:
            from wetext import Normalizer  # noqa: PLC0415 (only when normalisation is on)

            self._normalizer = Normalizer(lang="auto", operator="tn")

    def __call__(self, text: str) -> str:
        """Normalised text with whitespace collapsed (and none between CJK characters)."""
        text = _SPACES_RE.sub(" ", text).strip()
        if self._normalizer is None or not text or has_special_tokens(text):
            return text
        spoken = str(self._normalizer.normalize(text))
        return _CJK_GAP_RE.sub("", _SPACES_RE.sub(" ", spoken)).strip()

    def with_final_stop(self, text: str) -> str:
        """Upstream ends a text without final punctuation with "." (or "。" after CJK)."""
        if not self.enabled or not text or text[-1] in SENTENCE_END or has_special_tokens(text):
            return text
        return text + ("。" if is_cjk(text[-1]) else ".")


@dataclass(frozen=True)
class TextPiece:
    """One piece of the TTS text and its token ids."""

    text: str
    ids: tuple[int, ...]


class TextFrontend:
    """Text -> token ids for each LLM input."""

    def __init__(
        self, tokenizer: TextTokenizer, *, normalize: bool = True, split: SplitConfig | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.normalizer = TextNormalizer(enabled=normalize)
        self.split = split or SplitConfig()

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def pieces(self, text: str, *, field: str = "text") -> list[TextPiece]:
        """The TTS text as normalised, tokenized pieces; EmptyTextError if nothing is left."""
        normalised = self.normalizer.with_final_stop(self.normalizer(text))
        chunks = split_text(normalised, self.count_tokens, self.split)
        pieces = [TextPiece(c, tuple(self.tokenizer.encode(c))) for c in chunks if speakable(c)]
        if not pieces:
            raise EmptyTextError(
                f"{field}: nothing to speak after normalisation (only spaces or punctuation)"
            )
        return pieces

    def prompt_text_ids(self, transcript: str) -> list[int]:
        """The prompt's transcript, normalised as one piece (zero_shot)."""
        return self.tokenizer.encode(self.normalizer(transcript))

    def instruction_ids(self, instruction: str) -> list[int]:
        """instruct2's instruction, not normalised, ending in <|endofprompt|> (added if absent:
        upstream expects the caller to write it)."""
        text = instruction.strip()
        if not text.endswith(END_OF_PROMPT):
            text += END_OF_PROMPT
        return self.tokenizer.encode(text)
