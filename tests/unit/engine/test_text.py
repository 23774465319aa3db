"""Text front end: sentence splitting, piece packing, normalisation rules, token ids per mode."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.errors import EmptyTextError, InvalidRequestError
from workers.engine.normalizer import TextNormalizer
from workers.engine.text_frontend import TextFrontend, speakable, with_final_stop
from workers.engine.text_split import SplitConfig, split_sentences, split_text
from workers.model.directory import QWEN_DIR
from workers.model.tokenizer import END_OF_PROMPT, load_text_tokenizer


def words(text: str) -> int:
    """A stand-in token counter: one token per word (or per CJK character)."""
    return sum(len(w) if not w.isascii() else 1 for w in text.split())


@pytest.fixture(scope="module")
def frontend(tiny_model_dir: Path) -> TextFrontend:
    return TextFrontend(load_text_tokenizer(tiny_model_dir / QWEN_DIR))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("One. Two! Three? Four", ["One. ", "Two! ", "Three? ", "Four"]),
        ('He said "stop." Then left.', ['He said "stop." ', "Then left."]),
        ("Pi is 3.14 and it is 12:30 now.", ["Pi is 3.14 and it is 12:30 now."]),
        ("Wait... what?! Yes.", ["Wait... ", "what?! ", "Yes."]),
        ("今天天气很好。我们去公园吧！好的", ["今天天气很好。", "我们去公园吧！", "好的"]),
        ("「你好。」他说。", ["「你好。」", "他说。"]),
    ],
)
def test_sentences_keep_their_punctuation_and_join_back(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected
    assert "".join(split_sentences(text)) == text


def test_short_text_is_one_piece() -> None:
    assert split_text("Hello there. How are you?", words, SplitConfig()) == [
        "Hello there. How are you?"
    ]


def test_sentences_are_packed_up_to_the_budget() -> None:
    text = " ".join(f"Sentence number {i} has six words." for i in range(10))
    pieces = split_text(text, words, SplitConfig(max_piece_tokens=20, min_tail_tokens=0))
    assert all(words(p) <= 20 for p in pieces)
    assert [words(p) for p in pieces] == [18, 18, 18, 6]  # three sentences per piece
    assert " ".join(pieces) == text  # nothing lost or reordered


def test_a_short_tail_joins_the_piece_before() -> None:
    text = "a b c d e f g h. i j k l m n o p. q."
    pieces = split_text(text, words, SplitConfig(max_piece_tokens=10, min_tail_tokens=3))
    assert pieces == ["a b c d e f g h.", "i j k l m n o p. q."]


def test_a_long_sentence_breaks_at_clauses_then_words_then_characters() -> None:
    clauses = "one two three, four five six, seven eight nine."
    assert split_text(clauses, words, SplitConfig(max_piece_tokens=4, min_tail_tokens=0)) == [
        "one two three,",
        "four five six,",
        "seven eight nine.",
    ]
    many = " ".join(["word"] * 25)
    pieces = split_text(many, words, SplitConfig(max_piece_tokens=10, min_tail_tokens=0))
    assert [words(p) for p in pieces] == [10, 10, 5]
    unbroken = "x" * 50  # one "word": only characters are left to break at
    pieces = split_text(unbroken, len, SplitConfig(max_piece_tokens=16, min_tail_tokens=0))
    assert "".join(pieces) == unbroken and max(len(p) for p in pieces) <= 16


def test_normalisation_spells_out_and_can_be_turned_off() -> None:
    on, off = TextNormalizer(enabled=True), TextNormalizer(enabled=False)
    assert on("I have 23  apples.") == "I have twenty three apples."
    assert off("I have 23  apples.") == "I have 23 apples."
    assert "二十五" in on("气温25度。", "zh")


def test_special_tokens_are_refused_not_spoken(frontend: TextFrontend) -> None:
    with pytest.raises(InvalidRequestError, match=r"text: .* special token <\|endofprompt\|>"):
        frontend.pieces("You know 42<|endofprompt|>")
    with pytest.raises(InvalidRequestError, match="prompt_text: contains the model's special"):
        frontend.prompt_text_ids("hi <|im_end|>")
    with pytest.raises(InvalidRequestError, match="instruction: contains the model's special"):
        frontend.instruction_ids("calm <|im_start|> x")


def test_a_tag_no_longer_switches_normalisation_off(frontend: TextFrontend) -> None:
    [piece] = frontend.pieces("It costs $4.50 [laughter] today")
    assert piece.text == "It costs four dollars and fifty cents [laughter] today."


def test_final_stop() -> None:
    assert with_final_stop("Hello") == "Hello."
    assert with_final_stop("你好") == "你好。"
    assert with_final_stop("Hello!") == "Hello!"
    # ended inside its closing quotes: no stop after them (it was 「…順。」。)
    assert with_final_stop("話：「係呀，唔該晒。」") == "話：「係呀，唔該晒。」"
    assert with_final_stop("他问：“你来吗？”") == "他问：“你来吗？”"
    assert with_final_stop('She said "yes."') == 'She said "yes."'
    assert with_final_stop("《城南旧事》") == "《城南旧事》。"
    assert with_final_stop("(see above)") == "(see above)."


def test_digits_follow_the_request_language_then_the_voice(frontend: TextFrontend) -> None:
    assert frontend.pieces("2024")[0].text == "twenty twenty four."
    assert frontend.pieces("2024", language="zh")[0].text == "两千零二十四。"
    assert frontend.pieces("12345", transcript="你好，世界。")[0].text == "幺二三四五。"


def test_each_span_is_read_in_its_scripts_language_and_a_bad_symbol_costs_only_its_word(
    frontend: TextFrontend,
) -> None:
    pieces = frontend.pieces("On 12/31/1999 I was 1st and paid ₹500 × 2, 今天是2024年3月5日")
    assert " ".join(piece.text.strip() for piece in pieces) == (
        "On the thirty first of december nineteen ninety nine I was first and paid five "
        "hundred rupees times two, 今天是二零二四年三月五日。"
    )


def test_breaks_become_pauses_between_pieces(frontend: TextFrontend) -> None:
    pieces = frontend.pieces('<speak><break time="1s"/>One <break time="300ms"/> two</speak>')
    assert [(p.text, p.pause_before_s, p.pause_after_s) for p in pieces] == [
        ("One", 1.0, 0.0),
        ("two.", 0.3, 0.0),
    ]
    [tail] = frontend.pieces('Hi<break strength="x-strong"/>')
    assert (tail.text, tail.pause_before_s, tail.pause_after_s) == ("Hi.", None, 1.0)


def test_pieces_carry_token_ids(frontend: TextFrontend) -> None:
    pieces = frontend.pieces("Hello, world! It is 42.")
    assert len(pieces) == 1
    assert pieces[0].text == "Hello, world! It is forty two."
    assert list(pieces[0].ids) == frontend.tokenizer.encode(pieces[0].text)


@pytest.mark.parametrize("text", ["", "   ", "...", "!?。，"])
def test_nothing_speakable_raises(frontend: TextFrontend, text: str) -> None:
    with pytest.raises(EmptyTextError, match="text: nothing to speak"):
        frontend.pieces(text)


def test_punctuation_only_pieces_are_dropped(frontend: TextFrontend) -> None:
    assert not speakable("?!")
    assert [p.text for p in frontend.pieces("Yes. ... !")] == ["Yes. ... !"]


def test_instruction_is_not_normalised_and_ends_with_endofprompt(frontend: TextFrontend) -> None:
    tokenizer = frontend.tokenizer
    marker = tokenizer.token_id(END_OF_PROMPT)
    ids = frontend.instruction_ids("Say it in 2 ways")
    assert ids[-1] == marker and ids.count(marker) == 1
    assert tokenizer.decode(ids) == "Say it in 2 ways"  # the number is not spelled out
    assert frontend.instruction_ids(f"Calm{END_OF_PROMPT}").count(marker) == 1


def test_prompt_transcript_is_normalised_not_split(frontend: TextFrontend) -> None:
    ids = frontend.prompt_text_ids("One. Two. 3.")
    assert frontend.tokenizer.decode(ids) == "One. Two. three."
