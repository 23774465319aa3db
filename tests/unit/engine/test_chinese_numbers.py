"""A lone 2 in a Chinese text as Mandarin says it: a day of the month and an ordinal with 二,
a clock hour and a count with 两 (wetext read 3月2日 三月两日, 第2个 第两个, 2点 二点, 2次 二次).
The readings through wetext are in the corpus (normalisation_corpus.toml)."""

from __future__ import annotations

import pytest

from workers.engine.chinese_numbers import mandarin


@pytest.mark.parametrize(
    ("text", "written"),
    [
        ("3月2日", "3月二日"),
        ("3月 2 日", "3月 二 日"),
        ("于2日抵达，2日内", "于二日抵达，2日内"),  # a date; a span of days is wetext's 两日
        ("第2个", "第二个"),
        ("2点，2点半，2点30分，2點", "两点，两点半，两点30分，兩點"),
        ("2次，2次方", "两次，2次方"),  # squared is wetext's 二次方
        ("2個，2张", "兩個，2张"),  # wetext reads 2张 两张 already
    ],
)
def test_a_lone_2_is_written_as_mandarin_says_it(text: str, written: str) -> None:
    assert mandarin(text) == written


@pytest.mark.parametrize(
    "text",
    ["12日", "22日", "2.2日", "2022年", "2点5", "12点", "12次", "二日", "两点", "2月", "2号"],
)
def test_other_numbers_and_numbers_in_han_are_left_as_written(text: str) -> None:
    assert mandarin(text) == text
