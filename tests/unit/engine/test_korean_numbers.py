"""Korean numbers written out in Hangul (wetext has no Korean grammar: its English one read
"3,500원" as "three thousand five hundred 원")."""

from __future__ import annotations

import pytest

from workers.engine.korean_numbers import korean, native, sino
from workers.engine.normalizer import TextNormalizer


@pytest.mark.parametrize(
    ("number", "said"),
    [
        (0, "영"),
        (1, "일"),
        (10, "십"),
        (11, "십일"),
        (100, "백"),
        (1000, "천"),
        (3500, "삼천오백"),
        (10000, "만"),
        (15000, "만오천"),
        (100000, "십만"),
        (2026, "이천이십육"),
        (120000000, "일억이천만"),
    ],
)
def test_sino_korean_numbers(number: int, said: str) -> None:
    assert sino(number) == said


def test_native_numbers_before_counters() -> None:
    assert [native(n) for n in (1, 2, 3, 4, 10, 20, 21, 99)] == [
        "한", "두", "세", "네", "열", "스무", "스물한", "아흔아홉",
    ]  # fmt: skip
    assert korean("3시간, 3개월, 1번째, 제1장") == "세 시간, 삼개월, 첫 번째, 제일장"


def test_a_korean_span_keeps_its_latin_words_and_spaces() -> None:
    normalize = TextNormalizer(enabled=True)
    assert normalize("Kubernetes 버전 2.3.1을 15:30에 배포했다.") == (
        "Kubernetes 버전 이 점 삼 점 일을 십오 시 삼십 분에 배포했다."
    )
    assert normalize("오늘 3명이 왔다", "auto") == "오늘 세 명이 왔다"
    # an English sentence quoting a Korean word is read in English
    assert normalize("The word 사랑 means love, since 1990.") == (
        "The word 사랑 means love, since nineteen ninety."
    )


def test_a_request_in_korean_or_cantonese_reads_its_numbers_so() -> None:
    normalize = TextNormalizer(enabled=True)
    assert normalize("2026", "ko") == "이천이십육"  # a stretch of no letters, said in Korean
    assert normalize("오늘 3명", "ko") == "오늘 세 명"
    assert normalize("I have 3 apples.", "ko") == "I have three apples."
    assert normalize("一個餐蛋麵，42蚊。", "yue") == "一個餐蛋麵，四十二蚊。"  # read as Chinese
    assert normalize("2026", "yue") == "两千零二十六"
