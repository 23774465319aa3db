"""Normalisation: nothing escaped, numbers read in the chosen language, tags kept verbatim and
the text between them still spelled out. One normaliser per module (wetext loads slowly)."""

from __future__ import annotations

import string

import pytest

from workers.engine.normalizer import TextNormalizer, choose_language, detect_language


@pytest.fixture(scope="module")
def normalize() -> TextNormalizer:
    return TextNormalizer(enabled=True)


def test_double_quotes_are_not_escaped(normalize: TextNormalizer) -> None:
    assert normalize('He said "hello"', "en") == 'He said "hello"'
    assert normalize('他说"你好"，给我3个', "zh") == '他说"你好"，给我三个'
    assert normalize('He said "I have 3 apples"', "en") == 'He said "I have three apples"'


@pytest.mark.parametrize("language", ["en", "zh", "ja"])
@pytest.mark.parametrize("char", list(string.punctuation))
def test_every_printable_ascii_symbol_survives_unescaped(
    normalize: TextNormalizer, language: str, char: str
) -> None:
    text = f"7 {char} x"  # a digit, so every language's grammar runs
    spoken = normalize(text, language)  # type: ignore[arg-type]
    assert spoken.count("\\") == text.count("\\"), spoken
    if char in '"\\':  # the two characters wetext escaped
        assert char in spoken and f"\\{char}" not in spoken.replace("\\\\", ""), spoken


def test_letters_and_digits_survive_in_every_language(normalize: TextNormalizer) -> None:
    letters = string.ascii_letters
    for language in ("en", "zh", "ja"):
        assert letters in normalize(f"{letters} 1", language)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "english", "chinese"),
    [
        ("12345", "twelve thousand three hundred and forty five", "一万二千三百四十五"),
        ("2024", "twenty twenty four", "二零二四"),
        ("I paid $4.50", "I paid four dollars and fifty cents", "I paid 四点五零美元"),
        ("5kg", "five kilograms", "五千克"),
        ("2024-03-05", "the fifth of march twenty twenty four", "二零二四年三月五日"),
        ("3.5%", "three point five percent", "百分之三点五"),
        ("25℃", "twenty five degrees Celsius", "二十五摄氏度"),
    ],
)
def test_numbers_dates_currencies_units_in_en_and_zh(
    normalize: TextNormalizer, text: str, english: str, chinese: str
) -> None:
    assert normalize(text, "en") == english
    zh = normalize(text, "zh")
    assert zh == chinese or text.isdigit()  # bare digits: wetext zh reads a code or a count
    assert not any(c.isdigit() for c in zh)


def test_digit_only_text_is_english_unless_the_request_or_voice_says_otherwise() -> None:
    assert detect_language("12345") is None
    assert choose_language("auto", "12345") == "en"
    assert choose_language("auto", "2024", transcript="希望你以后能够做得比我还好呦。") == "zh"
    assert choose_language("auto", "2024", transcript="こんにちは") == "ja"
    assert choose_language("auto", "Hello 2024", transcript="你好") == "en"  # the text's own
    assert choose_language("zh", "Hello 2024") == "zh"
    assert choose_language("auto", "今天是2024年") == "zh"
    assert choose_language("auto", "今日は2024年です") == "ja"


def test_tags_are_kept_and_the_text_between_them_normalised(normalize: TextNormalizer) -> None:
    spoken = normalize("I [laughter] owe you $4.50, <strong>3</strong> times!", "en")
    assert spoken == (
        "I [laughter] owe you four dollars and fifty cents, <strong>three</strong> times!"
    )
    assert normalize("[breath]3[sigh]", "en") == "[breath]three[sigh]"


def test_cjk_spaces_and_disabled_normalisation(normalize: TextNormalizer) -> None:
    assert normalize("你好 世界", "zh") == "你好世界"
    assert TextNormalizer(enabled=False)("I have 23  apples.", "en") == "I have 23 apples."
