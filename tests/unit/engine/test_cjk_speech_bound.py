"""A Chinese, Japanese or Korean job accepted at submit is never refused by the worker for its
length. The speech bound counted tokens: the producer, which has no tokenizer, a floor of 0.4 a
Han character; the worker the model's real count (Qwen2 0.7-0.8 for Chinese prose, the tiny
model's byte BPE ~3), so a Chinese job of ~700-1,250 characters passed submit and failed in the
worker. Both now count CJK characters per character with the same code (`SpeechCount`), the
rest by tokens: for a text of only CJK the two estimates are equal, for a mixed text submit's
is never above the worker's. Checked on the corpus's texts and on Chinese prose cut to each
length of that band, against the real front end of the tiny model."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import soundfile

from shared.errors import InvalidRequestError
from shared.job_text import speech_floor
from shared.jobs import RequestLimits, validate_request
from shared.text_markup import SpeechCount, parse_markup
from workers.engine.api import SynthesisInput, VoicePrompt
from workers.engine.pipeline import EngineOptions, SynthesisPipeline, build_engine
from workers.engine.speech_bound import piece_speech

LIMITS = RequestLimits()
CORPUS = Path(__file__).parents[2] / "data" / "corpus"
ONLY_CJK = ["zh_novel.txt", "zh_commas.txt", "classical.txt", "yue.txt", "zh_ssml.txt"]
PROSE_TEXTS = ("zh_novel.txt", "zh_commas.txt")  # ~1,470 characters
MIXED = ["ja.txt", "ko.txt", "zh_mixed.txt", "mixed.txt"]
PROSE = "".join((CORPUS / name).read_text(encoding="utf-8").strip() for name in PROSE_TEXTS)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> SynthesisPipeline:
    """The tiny model's worker engine at the default bound, each piece 3 speech tokens long."""
    options = EngineOptions(
        max_speech_seconds=LIMITS.max_speech_seconds, forced_speech_tokens=3, flow_steps=1
    )
    return build_engine(tiny_model_dir, device="cpu", options=options)


def producer_s(text: str) -> float:
    count, pauses = speech_floor(parse_markup(text))
    return count.floor_seconds(pauses)


def worker_s(engine: SynthesisPipeline, text: str) -> float:
    pieces = engine.frontend.pieces(text)
    count = sum((piece_speech(p, engine.frontend.count_tokens) for p in pieces), SpeechCount())
    return count.seconds(sum(p.pause_before_s or 0.0 for p in pieces) + pieces[-1].pause_after_s)


def accepted_at_submit(text: str) -> bool:
    try:
        validate_request({"text": text}, LIMITS)
    except InvalidRequestError as e:
        assert "Chinese, Japanese or Korean characters" in str(e)
        return False
    return True


def accepted_by_worker(engine: SynthesisPipeline, text: str, voice: VoicePrompt) -> bool:
    try:
        engine.text_pieces(SynthesisInput(text=text, prompt=voice, seed=1))
    except InvalidRequestError as e:
        assert "COSYQ_MAX_SPEECH_SECONDS" in str(e)
        return False
    return True


@pytest.fixture(scope="module")
def voice(engine: SynthesisPipeline, tiny_model_dir: Path) -> VoicePrompt:
    samples, rate = soundfile.read(tiny_model_dir / "prompt.wav", dtype="float32")
    transcript = (tiny_model_dir / "prompt.txt").read_text().strip()
    return engine.extract_voice(samples, int(rate), transcript)


@pytest.mark.parametrize("name", ONLY_CJK + MIXED)
def test_submit_never_estimates_above_the_worker_and_equals_it_for_cjk_alone(
    engine: SynthesisPipeline, name: str
) -> None:
    text = (CORPUS / name).read_text(encoding="utf-8").strip()
    producer, worker = producer_s(text), worker_s(engine, text)
    assert producer <= worker, (producer, worker)
    if name in ONLY_CJK:
        assert producer == worker


@pytest.mark.parametrize(
    "text",
    [
        "跑了5m。",
        "第5章",
        "我用Python写了3个程序。",
        "今日は5mです。",
        "人々は〇〇へ。",
        "你好[laughter]世界",
    ],
)
def test_a_word_or_number_beside_cjk_counts_at_most_what_it_is_read_as(
    engine: SynthesisPipeline, text: str
) -> None:
    """Beside CJK characters a number or unit may become one syllable (5m is 五米: 0.4 s, not
    two tokens' 0.6 s), so submit counts each word there at 0.2 s."""
    assert producer_s(text) <= worker_s(engine, text)
    assert producer_s("跑了5m。") == worker_s(engine, "跑了5m。") == pytest.approx(0.8)


@pytest.mark.parametrize("length", range(700, 1251, 50))
def test_chinese_prose_across_the_band_is_refused_at_submit_or_accepted_by_the_worker(
    engine: SynthesisPipeline, voice: VoicePrompt, length: int
) -> None:
    """The band submit passed and the worker refused: now both say the same, either way."""
    text = PROSE[:length]
    assert producer_s(text) == worker_s(engine, text)
    assert accepted_at_submit(text) == accepted_by_worker(engine, text, voice), length


def test_a_chinese_job_of_1000_characters_is_refused_at_submit_saying_how_it_counted() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        validate_request({"text": PROSE[:1000]}, LIMITS)
    message = str(caught.value)
    assert message.startswith(
        "text: about 177 s of speech (883 Chinese, Japanese or Korean characters, 177 s at 0.2 s a "
        "Han character or Hangul syllable and 0.125 s a kana), limit 150 s"
    )


def test_chinese_prose_accepted_at_submit_is_synthesized_by_the_worker(
    engine: SynthesisPipeline, voice: VoicePrompt
) -> None:
    """The longest cut of the prose under the bound (the tiny model: ~3 tokens a character,
    ~2,100 tokens, over 600 s by the old count) is spoken, every character given the model."""
    text = max(
        (PROSE[:n] for n in range(700, 1000, 10) if producer_s(PROSE[:n]) <= 150),
        key=len,
    )
    assert len(text) >= 800 and accepted_at_submit(text)
    output = engine.synthesize(SynthesisInput(text=text, prompt=voice, seed=1))
    assert output.samples.size > 0 and np.isfinite(output.samples).all()
    spoken = "".join(piece.text for piece in output.pieces)
    assert [c for c in text if "\u4e00" <= c <= "\u9fff"] == [
        c for c in spoken if "\u4e00" <= c <= "\u9fff"
    ]
    assert output.text_tokens > 150 / 0.3  # what the old token count refused


def test_a_document_segment_is_split_by_the_same_count(
    engine: SynthesisPipeline, voice: VoicePrompt
) -> None:
    """`split_past_limit` checks each piece alone by the same estimate: a long Chinese text of
    short sentences is spoken piece by piece, never refused."""
    request = SynthesisInput(text=PROSE[:1000], prompt=voice, seed=1)
    with pytest.raises(InvalidRequestError, match="883 Chinese, Japanese or Korean characters"):
        engine.text_pieces(request)
    pieces = engine.text_pieces(dataclasses.replace(request, split_past_limit=True))
    assert sum(piece_speech(p, engine.frontend.count_tokens).cjk_characters for p in pieces) == 883
