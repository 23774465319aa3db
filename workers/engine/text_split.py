"""Long text -> pieces the LLM handles well: sentence boundaries first, then a token budget.

CosyVoice 2 speaks one piece at a time; a piece much longer than ~80 text tokens tends to drift
(skipped or repeated words), a very short one loses prosody. Upstream splits at punctuation and
merges by token counts (80 at most, a short tail merged); this is our own version of that rule:
1. sentences end at . ? ! ; : and their CJK forms (an ASCII "." or ":" only when followed by a
   space, a closing quote or the end, so "3.14", "12:30" and "e.g.x" stay whole), keeping any
   closing quotes and the following whitespace, so joining the sentences gives the text back;
2. consecutive sentences are packed into pieces of at most `max_piece_tokens` tokens; a sentence
   longer than that is broken at clause marks (, ，、), then between words, then between
   characters (a very long unbroken string), each time packing the parts again;
3. a last piece shorter than `min_tail_tokens` joins the piece before it when the two fit within
   `max_piece_tokens + min_tail_tokens`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from shared.sentences import split_sentences

_CLAUSE_RE = re.compile(r"(?<=[,，、])")
_WORD_RE = re.compile(r"(?<=\s)(?=\S)")

TokenCounter = Callable[[str], int]


@dataclass(frozen=True)
class SplitConfig:
    """Piece sizes in text tokens (upstream: token_max_n 80, merge_len 20)."""

    max_piece_tokens: int = 80
    min_tail_tokens: int = 20

    def __post_init__(self) -> None:
        if self.max_piece_tokens < 1 or self.min_tail_tokens < 0:
            raise ValueError("max_piece_tokens must be >= 1 and min_tail_tokens >= 0")


def _clauses(text: str) -> list[str]:
    return [part for part in _CLAUSE_RE.split(text) if part]


def _words(text: str) -> list[str]:
    return [part for part in _WORD_RE.split(text) if part]


def _characters(text: str) -> list[str]:
    return list(text)


_BREAKERS: tuple[Callable[[str], list[str]], ...] = (_clauses, _words, _characters)


def _greedy(parts: Sequence[str], count: TokenCounter, budget: int) -> list[str]:
    """Pack consecutive parts into chunks of at most `budget` tokens (a lone part may exceed)."""
    chunks: list[str] = []
    current = ""
    for part in parts:
        if current and count(current + part) > budget:
            chunks.append(current)
            current = part
        else:
            current += part
    if current:
        chunks.append(current)
    return chunks


def _fit(text: str, count: TokenCounter, budget: int, level: int = 0) -> list[str]:
    """`text` as chunks of at most `budget` tokens, broken as coarsely as possible."""
    if level == len(_BREAKERS) or count(text) <= budget:
        return [text]
    chunks = _greedy(_BREAKERS[level](text), count, budget)
    return [piece for chunk in chunks for piece in _fit(chunk, count, budget, level + 1)]


def split_text(text: str, count: TokenCounter, config: SplitConfig) -> list[str]:
    """Pieces of `text` for the LLM, in order, stripped, none empty."""
    units = [
        unit
        for sentence in split_sentences(text)
        for unit in _fit(sentence, count, config.max_piece_tokens)
    ]
    pieces = _greedy(units, count, config.max_piece_tokens)
    if len(pieces) > 1 and count(pieces[-1]) < config.min_tail_tokens:
        merged = pieces[-2] + pieces[-1]
        if count(merged) <= config.max_piece_tokens + config.min_tail_tokens:
            pieces[-2:] = [merged]
    return [piece.strip() for piece in pieces if piece.strip()]
