"""How many items (values and keys) a JSON body holds, counted from its bytes before parsing.

Why: `json.loads` is C that holds the GIL from its first byte to its last, and the front parses
in its event loop (a thread would not help: the GIL stays held). Its cost follows the items a
body holds, not its bytes: a 2 MB batch of texts parses in ~5 ms, the same 2 MB of `[],[],...`
(700,000 lists) in ~120-230 ms and of distinct keys in ~135 ms, during which every tenant's
request on that process waits (a /healthz took 2.4 s while one tenant sent such bodies). Legit
bodies are strings with few items around them (a batch of 1,000 requests: ~20,000), so a body
over COSYQ_HTTP_MAX_JSON_VALUES is refused before it is parsed, at the cost of a few scans of
its bytes in C.

The count: every item but the first follows a `,`, `:`, `[` or `{` outside a string, so the
count is 1 plus those bytes (an empty `[]` or `{}` counts one item more than it holds: the
parser builds it all the same). Counting them in the whole body, strings included, is an upper
bound found in a few C passes; only
a body over the limit by that bound is counted exactly, with its strings taken out (after its
escaped backslashes and quotes, every `"` left opens or closes a string: an invalid body is
refused by the parser anyway). Each string is an item, so a body of more strings than the limit
is over without splitting them out one by one.
"""

from __future__ import annotations

STRUCTURE = b",:[{"


def _structure(text: bytes) -> int:
    """How many of the bytes STRUCTURE `text` holds (one pass in C)."""
    return len(text) - len(text.translate(None, STRUCTURE))


def json_items_over(raw: bytes, limit: int) -> bool:
    """Whether the JSON text `raw` holds more than `limit` values and keys."""
    if _structure(raw) + 1 <= limit:  # strings included: an upper bound
        return False
    plain = raw.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in raw else raw
    if plain.count(b'"') // 2 > limit:  # each string is a value or a key
        return True
    outside = b"".join(plain.split(b'"')[::2])  # at most 2 * limit + 1 parts
    return _structure(outside) + 1 > limit
