"""The JSON item count the front refuses a body by before parsing it (producer/http/json_items):
exact against a reference tokenizer, whatever the strings hold."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from producer.http.json_items import json_items_over

STRING = re.compile(rb'"(?:[^"\\]|\\.)*"')  # the reference: a JSON string, escapes and all

SAMPLES: list[Any] = [
    [],
    {},
    "just a string",
    5,
    [1],
    {"a": 1},
    [[], [[]], {}],
    {"": ""},
    {"a": [1, 2.5, None, True, {"b": "c,d:[{"}], "e": {}},
    {'a\\"': "q\\\\", "b": ['\\"', ",,", "\\", '\\\\"', "é,:[{"]},  # escaped quotes, backslashes
    {"requests": [{"text": "One, two: three [laughter] {four}.", "metadata": {"k": [1, 2]}}] * 3},
]


def reference_items(raw: bytes) -> int:
    outside = STRING.sub(b"", raw)
    return 1 + sum(outside.count(mark) for mark in (b",", b":", b"[", b"{"))


@pytest.mark.parametrize("value", SAMPLES, ids=range(len(SAMPLES)))
@pytest.mark.parametrize("ensure_ascii", [True, False])
@pytest.mark.parametrize("separators", [None, (",", ":")])
def test_a_body_is_over_exactly_past_its_items(
    value: Any, ensure_ascii: bool, separators: tuple[str, str] | None
) -> None:
    raw = json.dumps(value, ensure_ascii=ensure_ascii, separators=separators).encode()
    items = reference_items(raw)
    assert not json_items_over(raw, items)
    assert json_items_over(raw, items - 1) or items == 1


def test_punctuation_inside_strings_is_no_item() -> None:
    """Prose full of commas and brackets is one string: 1,000 requests of it stay far under."""
    text = "One, two: three [laughter] {four}, " * 50
    raw = json.dumps({"requests": [{"text": text, "voice": "default"}] * 1000}).encode()
    assert raw.count(b",") > 100_000
    assert reference_items(raw) == 5003  # {"requests": [...]} and 1,000 x {"text", "voice"}
    assert not json_items_over(raw, 5003) and json_items_over(raw, 5002)


@pytest.mark.parametrize(
    "raw",
    [
        b"[" + b",".join([b"[]"] * 100_000) + b"]",
        b"[" + b",".join([b'"a"'] * 100_000) + b"]",  # more strings than the limit
        b"{" + b",".join(b'"%d":0' % i for i in range(60_000)) + b"}",
    ],
    ids=["lists", "strings", "keys"],
)
def test_dense_bodies_are_over(raw: bytes) -> None:
    assert json_items_over(raw, 65_536)
    assert not json_items_over(raw, reference_items(raw))
