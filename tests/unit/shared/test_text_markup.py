"""What user text may carry: control tags kept, special tokens and unknown markup refused,
SSML breaks as pauses, and the speech bound checked at submit where it can be."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from shared.errors import InvalidRequestError
from shared.jobs import RequestLimits, validate_request
from shared.text_markup import (
    CONTROL_TAGS,
    MarkupError,
    Pause,
    SpeechCount,
    minimum_text_tokens,
    parse_markup,
    speech_seconds,
)

LIMITS = RequestLimits()
CORPUS = Path(__file__).parents[2] / "data" / "corpus"

README = Path(__file__).resolve().parents[3] / "README.md"


def listed_tags(text: str, start: str, end: str) -> list[str]:
    """The backticked tags between `start` and `end` in `text`; `<a>…</a>` is both halves."""
    section = text[text.index(start) :]
    section = section[: section.index(end)]
    tags: list[str] = []
    for item in re.findall(r"`([^`]+)`", section):
        tags += item.split("…")
    return tags


def rejected(**fields: Any) -> str:
    with pytest.raises(InvalidRequestError) as caught:
        validate_request({"text": "Hello there.", **fields}, LIMITS)
    return str(caught.value)


def test_the_readme_lists_every_control_tag() -> None:
    tags = listed_tags(README.read_text(), "CosyVoice 2's control tags", "(the one list")
    assert sorted(tags) == sorted(CONTROL_TAGS)


def test_the_control_tags_are_cosyvoice2s_in_its_order(reference_dir: Path) -> None:
    """As the reference set's notes on upstream's tokenizer list them, after its chat tokens."""
    notes = (reference_dir / "README.md").read_text()
    tokens = listed_tags(notes, "these additional special tokens, in this order", ".\n")
    assert tokens[:3] == ["<|im_start|>", "<|im_end|>", "<|endofprompt|>"]
    assert tokens[3:] == list(CONTROL_TAGS)


@pytest.mark.parametrize("tag", CONTROL_TAGS)
def test_every_control_tag_passes_through(tag: str) -> None:
    text = f"Well {tag} that is it."
    assert parse_markup(text) == [text]
    assert validate_request({"text": text}, LIMITS).text == text


@pytest.mark.parametrize(
    "token", ["<|endofprompt|>", "<|im_start|>", "<|endoftext|>", "<|anything at all|>"]
)
def test_special_tokens_are_refused_naming_them(token: str) -> None:
    assert rejected(text=f"Hello {token} there").startswith(
        f"text: contains the model's special token {token}"
    )
    prompt = {"prompt_audio": "file:///p.wav", "prompt_text": f"hi {token}"}
    assert f"prompt_text: contains the model's special token {token}" in rejected(**prompt)


def test_instruction_may_end_with_the_separator_but_carry_no_other_token() -> None:
    ok = validate_request(
        {"text": "Hi.", "mode": "instruct2", "instruction": "Calmly.<|endofprompt|>"}, LIMITS
    )
    assert ok.instruction == "Calmly.<|endofprompt|>"
    message = rejected(mode="instruct2", instruction="Calm<|endofprompt|> now<|im_end|>")
    assert "instruction: contains the model's special token <|endofprompt|>" in message


def test_a_long_special_token_is_shortened_in_the_message() -> None:
    message = rejected(text="a <|" + "x" * 500 + "|> b")
    assert "x" * 50 not in message and "...|>" in message


def test_ssml_breaks_become_pauses_and_speak_is_dropped() -> None:
    text = '<speak>Hello <break time="1s"/> world &amp; you<break time="250ms"/>.</speak>'
    assert parse_markup(text) == [" Hello ", Pause(1.0), " world & you", Pause(0.25), ". "]
    assert parse_markup('a<break strength="strong"/>b<break/>c') == [
        "a",
        Pause(0.75),
        "b",
        Pause(0.5),
        "c",
    ]
    assert parse_markup("a<break time='2s'></break>b") == ["a", Pause(2.0), "b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('<speak><prosody rate="slow">Hi</prosody></speak>', 'markup <prosody rate="slow"> is'),
        ("Some <b>bold</b> text", "markup <b> is not supported"),
        ('<say-as interpret-as="date">1/2</say-as>', "markup <say-as interpret-as="),
        ('a <break time="abc"/>', 'text: <break time="abc"/>: time must be like 500ms or 1.5s'),
        ('a <break time="11s"/>', 'text: <break time="11s"/>: 11 s pause, limit 10 s'),
        ('a <break strength="huge"/>', "strength must be one of none, x-weak"),
        ('a <break size="2"/>', "attribute size is not supported"),
    ],
)
def test_unsupported_or_malformed_markup_is_refused(text: str, message: str) -> None:
    assert message in rejected(text=text)


def test_comparisons_are_not_markup() -> None:
    for text in ("x<y and y>z", "a < b > c", "<3 you", "I <3 [laughter]"):
        assert parse_markup(text) == [text]


def test_a_transcript_may_not_pause() -> None:
    prompt = {"prompt_audio": "file:///p.wav", "prompt_text": 'hi <break time="1s"/> there'}
    assert 'prompt_text: <break time="1s"/>: pauses are not allowed here' in rejected(**prompt)
    with pytest.raises(MarkupError):
        parse_markup("a<break/>b", allow_breaks=False)


def test_the_speech_floor_counts_words_and_numbers_not_tags() -> None:
    assert minimum_text_tokens("I have 23 apples, [laughter] 4.5 kg.") == 7
    assert minimum_text_tokens("今天 天气") == 2
    assert speech_seconds(10, 1.5) == pytest.approx(4.5)


def test_submit_refuses_what_it_can_tell_is_too_long() -> None:
    message = rejected(text="9 " * 1000)
    assert message.startswith("text: about 300 s of speech (at least 1,000 words or numbers")
    assert "limit 150 s (COSYQ_MAX_SPEECH_SECONDS)" in message
    pauses = "".join('<break time="10s"/>a' for _ in range(16))
    assert "text: about 165 s of speech" in rejected(text=pauses)
    # one unbroken run of digits is one word here: only the worker can count its expansion
    assert validate_request({"text": "9" * 2000}, LIMITS).text == "9" * 2000
    roomy = RequestLimits(max_speech_seconds=1000)
    assert validate_request({"text": "9 " * 1000}, roomy)


def test_language_field() -> None:
    assert validate_request({"text": "2024"}, LIMITS).language == "auto"
    assert validate_request({"text": "2024", "language": "zh"}, LIMITS).language == "zh"
    assert rejected(language="fr").startswith("language: input should be 'auto', 'en', 'zh'")
    # Korean and Cantonese users say so (it was a 400 for a text any worker reads)
    assert validate_request({"text": "안녕하세요", "language": "ko"}, LIMITS).language == "ko"
    assert validate_request({"text": "食咗飯未", "language": "yue"}, LIMITS).language == "yue"


def test_the_tokenizer_gives_each_control_tag_one_id(tiny_model_dir: Any) -> None:
    from workers.model.directory import QWEN_DIR  # noqa: PLC0415 (torch-side)
    from workers.model.tokenizer import load_text_tokenizer  # noqa: PLC0415

    tokenizer = load_text_tokenizer(tiny_model_dir / QWEN_DIR)
    ids = [tokenizer.token_id(tag) for tag in CONTROL_TAGS]
    assert ids == list(range(ids[0], ids[0] + len(CONTROL_TAGS)))  # consecutive, in this order
    assert ids[0] == tokenizer.token_id("<|endofprompt|>") + 1
    for tag in CONTROL_TAGS:
        assert tokenizer.encode(f"a{tag}b").count(tokenizer.token_id(tag)) == 1


def test_breaks_between_words_are_bounded_and_the_bound_is_a_setting() -> None:
    """Each stretch of words between breaks is a piece the model conditions on the whole voice
    prompt again: `a<break time="0ms"/>` 100 times fit the speech bound (0 s of pauses) and
    cost several times the CPU of the same words in one piece."""

    def broken(breaks: int, gap: str = '<break time="0ms"/>') -> str:
        return "<speak>" + ("a" + gap) * breaks + "a</speak>"

    assert validate_request({"text": broken(50)}, LIMITS)
    assert "51 <break>s between words, limit 50 (COSYQ_MAX_BREAKS)" in rejected(text=broken(51))
    assert validate_request({"text": broken(50, '<break time="0ms"/><break/>')}, LIMITS)
    assert validate_request({"text": broken(60)}, RequestLimits(max_breaks=60))


def test_the_speech_estimate_counts_cjk_characters_not_one_token_a_clause() -> None:
    """Chinese writes no spaces: a clause is one run of letters, once counted as one token, so
    a 2,000-character chapter (~1,600 Qwen2 tokens, ~480 s) passed submit and failed in the
    worker. Each CJK character now counts its speech (0.2 s a Han character or Hangul
    syllable, 0.125 s a kana), the same at submit and in the worker; other words one token."""
    assert minimum_text_tokens("今天天气很好，我们一起去公园散步吧。") == 2  # two runs of letters
    assert SpeechCount.of("今天天气很好，我们一起去公园散步吧。", minimum_text_tokens) == (
        SpeechCount(han=16)
    )
    korean = SpeechCount.of("감사합니다 안녕하세요 3개", minimum_text_tokens)
    assert korean == SpeechCount(hangul=11, tokens=1)
    assert korean.floor_seconds() == pytest.approx(11 * 0.2 + 0.2)  # "3" may be read as 세
    japanese = SpeechCount.of("ありがとうございます、人々。", minimum_text_tokens)
    assert japanese == SpeechCount(han=2, kana=10)  # 々 is a Han character, not a word
    assert japanese.floor_seconds() == pytest.approx(2 * 0.2 + 10 * 0.125)
    assert SpeechCount.of("hello world", minimum_text_tokens).floor_seconds() == pytest.approx(0.6)
    chapter = (CORPUS / "zh_commas.txt").read_text(encoding="utf-8").strip()
    message = rejected(text=(chapter * 3)[:2000])
    assert message.startswith("text: about 3")  # 1,8xx Han characters, 3xx s
    assert "1,8" in message and "Chinese, Japanese or Korean characters, 3" in message
    assert "s at 0.2 s a Han character or Hangul syllable and 0.125 s a kana" in message
    for name in ("zh_novel.txt", "ja.txt", "ko.txt", "yue.txt", "classical.txt"):
        text = (CORPUS / name).read_text(encoding="utf-8")
        assert validate_request({"text": text}, LIMITS).text == text.strip()
    # 787 Han characters, ~157 s: Qwen2's count (0.7-0.8 a character) is ~165-190 s
    assert "787 Chinese, Japanese or Korean characters" in rejected(text=chapter)
