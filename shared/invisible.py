"""Invisible format characters, which are never speech: dropped from every text before it is
counted (at submit) or read (in the worker), so both see the same characters.

- U+200B zero width space, U+2060 word joiner, U+FEFF (a byte order mark inside a text, or a
  zero width no-break space), U+00AD soft hyphen: text pasted from web pages, PDFs and word
  processors carries them between CJK characters and inside words ("infor\u00admation"), where
  they split a word in two for the tokenizer and for submit's count of words;
- U+200C zero width non-joiner and U+200D zero width joiner, except a joiner inside an emoji
  sequence (between two emoji, as in a family or a flag: the sequence is one picture).

Nothing else is touched: variation selectors, directional marks and tags stay as written.
"""

from __future__ import annotations

import re

# Emoji and what may end one before a joiner: pictographs, dingbats and misc symbols, the
# emoji variation selector (FE0F) and skin tones (in the pictograph block).
_EMOJI = "\u2600-\u27bf\u2b00-\u2bff\ufe0f\U0001f000-\U0001faff"
INVISIBLE_RE = re.compile(
    f"[\u200b\u200c\u2060\ufeff\u00ad]|(?<![{_EMOJI}])\u200d|\u200d(?![{_EMOJI}])"
)


def strip_invisible(text: str) -> str:
    """`text` without its invisible format characters (the module's list)."""
    return INVISIBLE_RE.sub("", text)
