"""No accepted document can fail on length (issue 45, item 1): whatever text `validate_document`
(the gate `submit_document` runs) accepts splits into segments that the worker accepts: its job
gate (`validate_request`) and the engine's own check before synthesis (`text_pieces`: the
model's tokenizer after normalisation, the count `max_speech_seconds` bounds), on the tiny
model's tokenizer, which makes ~0.7 tokens per letter where Qwen2 makes ~0.25."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shared.documents import DocumentLimits, validate_document
from shared.errors import InvalidRequestError
from shared.jobs import RequestLimits, validate_request
from shared.text_markup import estimated_text_tokens, minimum_text_tokens
from workers.engine.api import SynthesisInput, VoicePrompt
from workers.engine.pipeline import EngineOptions, build_engine

LIMITS = DocumentLimits()
PROMPT = VoicePrompt(
    speech_tokens=np.zeros(25, dtype=np.int32),
    mel=np.zeros((50, 80), dtype=np.float32),
    embedding=np.zeros(192, dtype=np.float32),
    transcript="a test prompt",
)
FINANCIAL = (
    "In the third quarter revenue was 1,234,567 dollars, up 12.5% from 987,654 dollars a year "
    "before; operating costs were $2,345,678.90 against $1,987,654.32, and the margin rose to "
    "23.4% on 03/04/2025. "
)

words = st.sampled_from(
    ["revenue", "was", "the", "clocks", "struck", "thirteen", "今天", "天气", "こんにちは", "über"]
)
numbers = st.one_of(
    st.integers(0, 10**12).map(lambda n: f"{n:,}"),
    st.integers(0, 10**9).map(str),
    st.floats(0, 1e6, allow_nan=False).map(lambda x: f"${x:,.2f}"),
    st.integers(0, 1000).map(lambda n: f"{n / 10}%"),
    st.dates().map(lambda d: d.isoformat()),
    st.dates().map(lambda d: d.strftime("%m/%d/%Y")),
)
markup = st.sampled_from(["[laughter]", "<strong>loud</strong>", "[breath]", "*so*", "# Title\n"])
tokens = st.one_of(words, numbers, markup, st.text(min_size=1, max_size=8))
sentences = st.lists(tokens, min_size=1, max_size=40).map(lambda t: " ".join(t) + ".")
documents = st.lists(st.lists(sentences, min_size=1, max_size=12), min_size=1, max_size=6).map(
    lambda paragraphs: "\n\n".join(" ".join(p) for p in paragraphs)
)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny engine under the deployment's default speech bound (150 s)."""
    options = EngineOptions(max_speech_seconds=RequestLimits().max_speech_seconds)
    return build_engine(
        tiny_model_dir,
        device="cpu",
        options=options,
        hash_cache_dir=tmp_path_factory.mktemp("hashes"),
    )


def worker_accepts(engine: Any, job: dict[str, Any]) -> int:
    """The worker's checks of one segment's job, without synthesis; its text tokens."""
    request = validate_request(job, LIMITS.request)
    data = SynthesisInput(
        text=request.text, prompt=PROMPT, language=request.language, split_past_limit=True
    )
    return sum(len(piece.ids) for piece in engine.text_pieces(data))


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(text=documents, markup_kind=st.sampled_from(["auto", "plain", "markdown"]))
@example(text=FINANCIAL * 5, markup_kind="plain")
def test_every_accepted_document_splits_into_segments_the_worker_accepts(
    engine: Any, text: str, markup_kind: str
) -> None:
    try:
        plan = validate_document({"text": text, "markup": markup_kind}, LIMITS)
    except InvalidRequestError:
        return
    for job in plan.jobs:
        worker_accepts(engine, job.model_dump(mode="json"))


def test_the_financial_text_of_the_issue_is_accepted_though_the_model_counts_more(
    engine: Any,
) -> None:
    text = (FINANCIAL * 5)[:843]
    plan = validate_document({"text": text}, LIMITS)
    counted = [worker_accepts(engine, job.model_dump(mode="json")) for job in plan.jobs]
    bound_tokens = RequestLimits().max_speech_seconds / 0.3
    assert sum(counted) > bound_tokens  # one request of it would be refused ...
    assert len(plan.segments) > 1  # ... and the estimate split it


def test_a_whole_request_over_the_bound_is_still_refused(engine: Any) -> None:
    data = SynthesisInput(text=(FINANCIAL * 5)[:843], prompt=PROMPT)
    with pytest.raises(InvalidRequestError, match="COSYQ_MAX_SPEECH_SECONDS"):
        engine.text_pieces(data)


def test_the_estimate_counts_digits_as_the_words_they_become() -> None:
    assert minimum_text_tokens("1,234,567") == 3
    assert estimated_text_tokens("1,234,567") >= 12  # "one million two hundred thirty four ..."
    assert estimated_text_tokens("word " * 10) >= minimum_text_tokens("word " * 10)


FULL = ("The quick brown fox jumps over the lazy dog and keeps running far away. " * 14)[:985]
FULL = FULL.rsplit(" ", 1)[0] + "."  # one paragraph that all but fills a segment


@pytest.mark.parametrize(
    "text",
    [
        FULL + "\n\n...",  # a closing ellipsis left alone in the last segment
        FULL + "\n\n🎉🎉🎉",  # a line of emoji
        FULL + ' "…"',  # a quoted ellipsis after the last sentence
        FULL + "\n\n---\n\n" + "word " * 199 + "end.",  # a rule before a sentence that fills one
        "🎉\n\n" + "word " * 199 + "end.",  # an emoji line first
    ],
    ids=["ellipsis-last", "emoji-last", "quote-last", "rule-middle", "emoji-first"],
)
def test_a_stretch_with_nothing_to_speak_never_becomes_a_segment_of_its_own(
    engine: Any, text: str
) -> None:
    """The worker refuses for good a job with nothing to speak after normalisation: a segment
    of only punctuation or emoji would fail its document on every retry."""
    plan = validate_document({"text": text}, LIMITS)
    for job in plan.jobs:
        worker_accepts(engine, job.model_dump(mode="json"))
    assert "fox" in plan.segments[0].plain or "word" in plan.segments[0].plain


@pytest.mark.parametrize("text", ["...", "🎉🎉", "---\n\n…"])
def test_a_document_with_nothing_to_speak_is_refused_at_submit(text: str) -> None:
    with pytest.raises(InvalidRequestError, match="nothing to speak"):
        validate_document({"text": text}, LIMITS)


def test_a_document_with_windows_line_endings_reads_as_its_unix_twin(engine: Any) -> None:
    """CRLF (a text file saved on Windows) and lone CR are line ends, not control characters."""
    unix = "# Title\n\nFirst paragraph, one line.\nSecond line.\n\nLast paragraph.\n"
    expected = validate_document({"text": unix, "markup": "markdown"}, LIMITS).segments
    for ending in ("\r\n", "\r"):
        text = unix.replace("\n", ending)
        plan = validate_document({"text": text, "markup": "markdown"}, LIMITS)
        assert plan.segments == expected
        for job in plan.jobs:
            worker_accepts(engine, job.model_dump(mode="json"))


def test_a_document_saved_with_a_byte_order_mark_reads_as_its_twin_without() -> None:
    """Notepad's UTF-8 starts with U+FEFF: never part of the first segment's words (its
    manifest text and captions) nor a job's text."""
    unix = "# Title\n\nFirst paragraph.\n\nLast paragraph.\n"
    expected = validate_document({"text": unix, "markup": "markdown"}, LIMITS).segments
    for markup in ("markdown", "auto"):
        plan = validate_document({"text": "\ufeff" + unix, "markup": markup}, LIMITS)
        assert not any("\ufeff" in s.text or "\ufeff" in s.plain for s in plan.segments)
    plan = validate_document({"text": "\ufeff" + unix, "markup": "markdown"}, LIMITS)
    assert plan.segments == expected


PROSE = (
    "It was a bright cold day in April, and the clocks were striking thirteen \u2014 though "
    "not quickly enough\u2026 "
)
CORPUS = {
    "prose": "# Chapter 1\n\n" + PROSE * 30 + "\n\n## Section\n\n" + PROSE * 10,
    "lists": "Intro:\n\n- first item\n- second with `code`\n* third\n\n1. one\n2. two\n3) three\n",
    "links": "See https://example.com/a/b?c=d&e=f#frag or mail john.doe+tag@example.co.uk now.",
    "table": "| a | b |\n|---|---|\n| 1 | 2 |\n| x | y |\n",
    "quote": "> A quote here.\n> More quote.\n\n>> nested\n",
    "emoji": "I love it \U0001f600\U0001f389\U0001f44d\U0001f3fd so much! "
    "\U0001f468\u200d\U0001f469",
    "scripts": "\u4eca\u5929\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed"
    "\u3002The weather is nice today. \u4eca\u65e5\u306f\u3044\u3044\u5929\u6c17\u3067\u3059"
    "\u306d\u3002Let's go!",
    "run-on": " ".join(f"and the {n}th clause went on" for n in range(200))[:3000],
    "run-on-nospace": "a" * 3000,
    "run-on-zh": "\u6211\u4eec" * 1500,
    "run-on-digits": "1234567890" * 300,
    "punctuation": "Hello.\n\n!!!???...\n\n1234 5678 90\n\n---\n\n***\n\nBye.",
    "numbers": "123\n\n456\n\n3.14159\n\n1,000,000",
    "blank-lines": "One.\n   \n\t\n \u00a0 \nTwo.\n\n\n\n\nThree.",
    "crlf": "One.\r\n\r\nTwo.\r\nThree.\r\n",
    "bom": "\ufeffHello there. A BOM starts me.",
    "zero-width": "Zero\u200bwidth\u200cjoin\u200dhere.\n\n\u200b\u200c\u200d\u2060\n\nEnd.",
    "nbsp-tabs": "Non\u00a0breaking\u202fspace.\tCol1\tCol2\n\tIndented line.",
    "dashes": "Well \u2014 yes \u2013 no \u2012 maybe \u2015 ... \u2026 \u2025",
    "code": "Text `inline()` more.\n\n```python\nprint('hi')\n```\n\n    indented code\n\nEnd.",
    "symbols": "E = mc\u00b2 and \u00bd cup, \u2460 \u2461, \u216b o'clock, a & b < c > d.",
    "alone": FULL + "\n\n\u00b2\u00b3\n\n" + FULL + "\n\n\u30fc\u3005\n\n\u0301\u0301",
}


@pytest.mark.parametrize("markup", ["auto", "markdown"])
@pytest.mark.parametrize("name", list(CORPUS))
def test_ordinary_text_is_accepted_whole_and_every_segment_is_one_the_worker_speaks(
    engine: Any, name: str, markup: str
) -> None:
    """Ordinary text (and its odd corners) is never accepted and then refused by the worker:
    each segment has something to speak after normalisation and fits the job's limits."""
    plan = validate_document({"text": CORPUS[name], "markup": markup}, LIMITS)
    for job in plan.jobs:
        assert len(job.text) <= LIMITS.split.max_chars
        assert worker_accepts(engine, job.model_dump(mode="json")) > 0


def test_a_markdown_table_is_read_row_by_row_as_its_cells() -> None:
    """A table (GFM, as README and Chinese release notes write them) was one paragraph of
    pipes and rule dashes given to the model ("| 指标 | 旧版本 | |------|")."""
    header = "## 性能对比\n\n| 指标 | 旧版本 | 新版本 |\n|---|---|---|\n"
    table = header + "| 首包延迟 | 350毫秒 | 190毫秒 |\n"
    plan = validate_document({"text": table, "markup": "markdown"}, LIMITS)
    spoken = " ".join(segment.plain for segment in plan.segments)
    assert spoken == "性能对比 指标, 旧版本, 新版本 首包延迟, 350毫秒, 190毫秒"
    assert "|" not in "".join(s.text for s in plan.segments)
