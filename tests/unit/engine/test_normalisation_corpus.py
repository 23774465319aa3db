"""The normalisation corpus: each sentence read as a listener needs it (normalisation_corpus.toml,
readings checked by hand). Known limitations are reported as xfail with their reason, and fail
if what we produce for them changes (fixed, or worse: either way the corpus needs a look)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from workers.engine.normalizer import TextNormalizer

CORPUS: list[dict[str, Any]] = tomllib.loads(
    (Path(__file__).parent / "normalisation_corpus.toml").read_text(encoding="utf-8")
)["case"]


@pytest.fixture(scope="module")
def normalize() -> TextNormalizer:
    return TextNormalizer(enabled=True)


def test_the_corpus_covers_every_kind_and_each_limitation_says_why() -> None:
    kinds = {case["kind"] for case in CORPUS}
    assert kinds >= {"number", "date", "time", "money", "unit", "percent", "ordinal", "url"}
    assert kinds >= {"email", "symbol", "mixed", "issue"}
    for case in CORPUS:
        assert ("known" in case) == ("now" in case), case["text"]
        assert case.get("now") != case["spoken"], case["text"]


@pytest.mark.parametrize(
    "case", CORPUS, ids=[f"{case['kind']}-{index}" for index, case in enumerate(CORPUS)]
)
def test_each_sentence_is_read_as_a_listener_needs(
    normalize: TextNormalizer, case: dict[str, Any]
) -> None:
    spoken = normalize(case["text"], case["language"])
    if "known" not in case:
        assert spoken == case["spoken"]
        return
    assert spoken != case["spoken"], "a known limitation is now read right: drop known and now"
    assert spoken == case["now"], "a known limitation reads differently now: check the corpus"
    pytest.xfail(f"known limitation: {case['known']}")
