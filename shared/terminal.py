"""What a tenant wrote, made safe to show on an operator's terminal.

A webhook receiver's error answer, a failure message, a URL path in the access log: text a
tenant chose reaches `cosyq webhooks failed`, `cosyq status` and the console log. Written as
is, an ESC there is a terminal command (clear the screen, set the clipboard with OSC 52, hide a
link with OSC 8, move the cursor to overwrite earlier lines), a C1 control is one on terminals
that read 8-bit controls, and a bidi override (U+202E) shows the characters after it reversed.
`shown` writes each such character as its `\\uXXXX` escape instead: readable, and still valid
inside a JSON string (`cosyq result` prints JSON), where it decodes to the same value.
Input rules stay as they are; this is the output's own escaping. No rich, no structlog here:
the console (shared/console.py) and the log (shared/logs.py) both use it.
"""

from __future__ import annotations

import re

# C0 but tab and newline (ESC, CR, BEL, BS ...), DEL, C1 (U+0080-U+009F: CSI, OSC, ST ...), and
# Unicode's bidi embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069, U+061C).
UNSAFE_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u202a-\u202e\u2066-\u2069]")
# The same, newline and Unicode's line and paragraph separators (U+2028, U+2029: a line break to
# Python's `splitlines`): a value in a log line, where a line break would start a forged line.
UNSAFE_IN_LINE_RE = re.compile(
    r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)


def _escaped(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def shown(text: str, *, one_line: bool = False) -> str:
    """`text` with every terminal control and bidi control as `\\uXXXX` (`one_line`: newlines
    too); tab and, unless `one_line`, newline kept."""
    return (UNSAFE_IN_LINE_RE if one_line else UNSAFE_RE).sub(_escaped, text)
