"""Captions: a piece too long to read at once is cut into cues of at most 24 CJK characters
(84 other ones), at sentence ends first, then at clause marks (，、 among them), its time
shared by speech. A cue was a whole piece: ~100 Chinese characters on screen for 20 s."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from shared.caption_cues import CUE_CJK_CHARS, CUE_LATIN_CHARS, cue_units
from shared.captions import Cue, cues_from_pieces, to_srt
from shared.results import PieceTiming

CORPUS = Path(__file__).parents[2] / "data" / "corpus"
NOVEL = "".join((CORPUS / "zh_novel.txt").read_text(encoding="utf-8").split()[1:])[:100]
JAPANESE = "".join((CORPUS / "ja.txt").read_text(encoding="utf-8").split()[1:])[:100]
ENGLISH = (
    "The quick brown fox jumps over the lazy dog, and then it runs far away into the deep "
    "forest where nobody can find it. Then the story ends here, with nothing more to say."
)


def cues_of(text: str, start_s: float = 3.0, end_s: float = 23.0) -> list[Cue]:
    return cues_from_pieces([PieceTiming(text=text, start_s=start_s - 1.0, end_s=end_s - 1.0)], 1.0)


@pytest.mark.parametrize("text", [NOVEL, JAPANESE, ENGLISH, "一" * 100, "word" * 60])
def test_a_long_piece_becomes_cues_within_the_bound_covering_its_time(text: str) -> None:
    cues = cues_of(text)
    assert len(cues) > 1
    assert "".join(c.text for c in cues).replace(" ", "") == text.replace(" ", "")
    for cue in cues:
        assert cue_units(cue.text) <= cue_units("一" * CUE_CJK_CHARS)
        assert cue_units(cue.text) <= cue_units("a" * CUE_LATIN_CHARS)
    assert cues[0].start_s == 3.0 and cues[-1].end_s == pytest.approx(23.0)
    for before, after in pairwise(cues):
        assert before.start_s < before.end_s == after.start_s


def test_chinese_cues_break_at_cjk_punctuation_when_it_has_some() -> None:
    cues = cues_of(NOVEL)
    assert len(NOVEL) == 100 and all(len(c.text) <= CUE_CJK_CHARS for c in cues)
    assert all(c.text[-1] in "。，！？；：、”" for c in cues[:-1]), [c.text for c in cues]
    assert len(to_srt(cues).split("\n\n")) > 1  # rendered as several cues


def test_an_unbroken_run_is_cut_evenly_not_with_a_dangling_tail() -> None:
    widths = [len(c.text) for c in cues_of("一" * 27)]
    assert widths == [14, 13]


def test_time_follows_speech_not_characters() -> None:
    """A kana is 0.125 s, a Han character 0.2 s: 23 kana take less time than 23 Han."""
    cues = cues_of("あ" * 23 + "。" + "一" * 23 + "。", 1.0, 10.0)
    assert [len(c.text) for c in cues] == [24, 24]
    assert cues[0].end_s - cues[0].start_s < cues[1].end_s - cues[1].start_s


@pytest.mark.parametrize("text", ["今天天气很好。", "Hello there, how are you today?", NOVEL[:24]])
def test_a_piece_within_the_bound_stays_one_cue(text: str) -> None:
    assert cues_of(text) == [Cue(3.0, 23.0, text)]
