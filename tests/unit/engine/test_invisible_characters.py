"""Invisible format characters (zero width space, joiners outside emoji, word joiner, an inner
byte order mark, soft hyphen) never reach the model, and submit counts a text without them, as
the worker reads it: a text of only them is empty, and they neither lengthen a text nor split
its words (a soft hyphen made "infor\u00admation" two words at submit, one in the worker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.errors import InvalidRequestError
from shared.invisible import INVISIBLE_RE, strip_invisible
from shared.job_text import speech_floor
from shared.jobs import RequestLimits, validate_request
from shared.text_markup import parse_markup
from workers.engine.normalizer import TextNormalizer
from workers.engine.text_frontend import TextFrontend
from workers.model.directory import QWEN_DIR
from workers.model.tokenizer import load_text_tokenizer

INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff\u00ad"
FAMILY = "\U0001f468\u200d\U0001f469\u200d\U0001f467"  # one emoji: man, woman, girl
RAINBOW_FLAG = "\U0001f3f3\ufe0f\u200d\U0001f308"


@pytest.fixture(scope="module")
def frontend(tiny_model_dir: Path) -> TextFrontend:
    return TextFrontend(load_text_tokenizer(tiny_model_dir / QWEN_DIR))


@pytest.mark.parametrize("char", list(INVISIBLE))
def test_each_is_dropped_by_the_normaliser_even_when_off(char: str) -> None:
    for enabled in (True, False):
        spoken = TextNormalizer(enabled=enabled)(f"你{char}好，infor{char}mation。", "zh")
        assert not INVISIBLE_RE.search(spoken), (enabled, spoken)
        assert "你好" in spoken and "information" in spoken


def test_no_piece_and_no_prompt_text_carries_one(frontend: TextFrontend) -> None:
    text = "\ufeff今天\u200b天气\u2060很好。Soft\u00adware is\u200cgood."
    for raw in (False, True):
        for piece in frontend.pieces(text, raw=raw):
            assert not INVISIBLE_RE.search(piece.text), piece.text
    assert frontend.raw_prompt_text_ids("你\u200b好") == frontend.raw_prompt_text_ids("你好")
    assert frontend.prompt_text_ids("你\u200b好") == frontend.prompt_text_ids("你好")


def test_an_emoji_sequence_keeps_its_joiners() -> None:
    assert strip_invisible(f"a{FAMILY}b {RAINBOW_FLAG}") == f"a{FAMILY}b {RAINBOW_FLAG}"
    assert strip_invisible("\U0001f468\u200d x\u200d\U0001f469") == "\U0001f468 x\U0001f469"


def test_submit_refuses_a_text_of_only_invisible_characters_as_empty() -> None:
    with pytest.raises(InvalidRequestError, match="text: must not be empty"):
        validate_request({"text": INVISIBLE * 3}, RequestLimits())


def test_submit_counts_the_visible_characters_against_the_limit() -> None:
    limits = RequestLimits()
    text = "a\u200b" * limits.max_text_chars  # 2 x the limit as written, the limit as read
    request = validate_request({"text": text}, limits)
    assert request.text == "a" * limits.max_text_chars


def test_a_soft_hyphen_no_longer_doubles_a_words_floor_at_submit() -> None:
    """20 words are 6 s at submit's floor of a token each; read as 40, 12 s: over 10 s."""
    limits = RequestLimits(max_speech_seconds=10.0)
    request = validate_request({"text": "infor\u00admation " * 20}, limits)
    assert request.text == ("information " * 20).strip()
    count, _ = speech_floor(parse_markup(request.text))
    assert count.tokens == 20  # one word each, as the worker's tokenizer reads them
