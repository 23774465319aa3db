"""Where sentences end: one rule for the engine's piece splitter and the producer's document
splitter, so a document segment never ends where the engine would not end a sentence.

Sentences end at . ? ! ; : and their CJK forms (an ASCII "." or ":" only when followed by a
space, a closing quote or the end, so "3.14", "12:30" and "e.g.x" stay whole), keeping any
closing quotes and the following whitespace, so joining the sentences gives the text back.
"""

from __future__ import annotations

SENTENCE_END = frozenset(".?!;:。？！；：…")
ASCII_SOFT_END = frozenset(".:")  # also decimal points, times, abbreviations inside words
CLOSING = frozenset("\"'”’)]}）」』》")


def _ends_sentence(text: str, index: int) -> bool:
    if text[index] not in ASCII_SOFT_END:
        return True
    after = text[index + 1] if index + 1 < len(text) else " "
    return after.isspace() or after in CLOSING or after in SENTENCE_END


def split_sentences(text: str) -> list[str]:
    """Sentences with their punctuation, closing quotes and trailing space; join == text."""
    sentences: list[str] = []
    start = index = 0
    while index < len(text):
        if text[index] in SENTENCE_END and _ends_sentence(text, index):
            end = index + 1
            while end < len(text) and (text[end] in SENTENCE_END or text[end] in CLOSING):
                end += 1
            while end < len(text) and text[end].isspace():
                end += 1
            sentences.append(text[start:end])
            start = index = end
            continue
        index += 1
    if start < len(text):
        sentences.append(text[start:])
    return sentences
