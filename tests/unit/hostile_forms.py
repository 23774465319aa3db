"""Ways a hostile user writes a string so that some decoding step turns it back into itself:
XML/HTML character references (decimal, hex in either case, leading zeros, named, with and
without the semicolon) and the whole thing escaped again. Shared by the hostile-input tests."""

from __future__ import annotations

import html.entities

from hypothesis import strategies as st

# Every name html.unescape knows for a character ("lt;", "LT", "vert;", "VerticalLine;" ...).
_NAMES: dict[str, list[str]] = {}
for _name, _value in html.entities.html5.items():
    _NAMES.setdefault(_value, []).append(_name)


def _mixed_case(draw: st.DrawFn, text: str) -> str:
    flips = draw(st.lists(st.booleans(), min_size=len(text), max_size=len(text)))
    return "".join(c.upper() if flip else c.lower() for c, flip in zip(text, flips, strict=True))


@st.composite
def character_form(draw: st.DrawFn, char: str) -> str:
    """`char` as itself or as one of its character references."""
    zeros = "0" * draw(st.integers(0, 3))
    end = draw(st.sampled_from([";", ";", ""]))  # html.unescape also takes "&#60" unterminated
    forms = [
        char,
        f"&#{zeros}{ord(char)}{end}",
        f"&#{draw(st.sampled_from('xX'))}{zeros}{_mixed_case(draw, format(ord(char), 'x'))}{end}",
    ]
    forms += [f"&{name}" for name in _NAMES.get(char, [])]
    return draw(st.sampled_from(forms))


@st.composite
def entity_form(draw: st.DrawFn, token: str) -> str:
    """`token` with any of its characters as references, then escaped again 0-2 times."""
    written = "".join(draw(character_form(char)) for char in token)
    for _ in range(draw(st.integers(0, 2))):
        amp = draw(st.sampled_from(["&amp;", "&#38;", "&#x26;", "&AMP;", "&amp"]))
        written = written.replace("&", amp)
    return written


def fully_decoded(text: str) -> str:
    """`text` unescaped until nothing changes (what the deepest decoding makes of it)."""
    while (again := html.unescape(text)) != text:
        text = again
    return text
