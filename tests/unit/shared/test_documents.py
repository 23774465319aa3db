"""The document contract and splitter: boundaries, limits, markup, seeds, captions."""

from __future__ import annotations

from typing import Any

import pytest

from shared import text_markup
from shared.captions import Cue, render, to_srt, to_vtt
from shared.document_split import Pauses, SplitLimits, fits, split_document
from shared.documents import DocumentLimits, segment_seed, validate_document
from shared.errors import InvalidRequestError
from shared.jobs import RequestLimits, validate_request
from shared.sentences import split_sentences
from shared.text_markup import parse_markup, text_of

PAUSES = Pauses(sentence=0.1, paragraph=0.6, heading=0.9)
SENTENCE = "Each sentence here is about fifty characters long. "


def test_segments_end_at_sentences_and_keep_every_word_in_order() -> None:
    text = SENTENCE * 40 + "\n\n" + SENTENCE * 40
    segments = split_document(text, "plain", SplitLimits(max_chars=300), PAUSES)
    assert all(len(s.text) <= 300 for s in segments)
    assert all(s.plain.endswith("long.") for s in segments)  # never mid-sentence
    assert " ".join(s.plain for s in segments).split() == text.split()
    assert segments[0].pause_before_s == 0.0
    assert {s.pause_before_s for s in segments[1:]} <= {0.1, 0.6}


def test_a_paragraph_inside_a_segment_is_a_break_of_the_paragraph_pause() -> None:
    segments = split_document("One.\n\nTwo.", "plain", SplitLimits(), PAUSES)
    assert [s.text for s in segments] == ['One. <break time="600ms"/> Two.']
    assert text_of(parse_markup(segments[0].text)) == "One. Two."


def test_markdown_headings_pause_longer_and_inline_markup_is_dropped() -> None:
    text = "# Title\n\nSome *emphasis* and a [link](http://x.y). `code`\n\n```\nskipped()\n```"
    segments = split_document(text, "markdown", SplitLimits(max_chars=20), PAUSES)
    assert [s.plain for s in segments] == ["Title", "Some emphasis and a", "link. code"]
    assert segments[1].pause_before_s == 0.9 and segments[1].boundary == "heading"


def test_markdown_code_spans_are_characters_never_markup() -> None:
    """A README's `Vector<int>`, `<div>` or `<|endoftext|>` in backticks is code, read as its
    characters: the document was refused ("markup <int> is not supported")."""
    text = "# API\n\nA `Vector<int>` in a `<div>`; see `</b>` and `<|endoftext|>` tokens."
    plan = validate_document({"text": text, "markup": "markdown"}, DocumentLimits())
    spoken = " ".join(s.plain for s in plan.segments)
    assert spoken == "API A Vector< int> in a < div>; see < /b> and < |endoftext|> tokens."
    for job in plan.jobs:
        assert validate_request(job, RequestLimits()) == job


def test_plain_text_reads_angle_brackets_as_written_and_auto_names_plain() -> None:
    """Prose with "List<String>", "<b>" or the model's "<|user|>" had no way in: refused as
    markup, as `auto` and `plain` alike. As `plain` it is read as written (the worker takes its
    jobs); as `auto` the refusal names `plain`."""
    text = "A List<String> and <b>bold</b> text, then <|user|> and <break time='1s'/>."
    plan = validate_document({"text": text, "markup": "plain"}, DocumentLimits())
    assert [s.plain for s in plan.segments] == [
        "A List< String> and < b>bold< /b> text, then < |user|> and < break time='1s'/>."
    ]
    for job in plan.jobs:
        assert validate_request(job, RequestLimits()) == job
    with pytest.raises(InvalidRequestError, match=r'token <\|user\|>.*send markup "plain"'):
        validate_document({"text": text}, DocumentLimits())
    with pytest.raises(InvalidRequestError) as refused:  # no hint where plain cannot help
        validate_document({"text": "<speak><prosody>x</prosody></speak>"}, DocumentLimits())
    assert "plain" not in str(refused.value)


def test_a_sentence_too_long_alone_is_cut_at_clauses_then_words() -> None:
    sentence = ", ".join(f"clause number {i} goes on" for i in range(30)) + "."
    segments = split_document(sentence, "plain", SplitLimits(max_chars=100), PAUSES)
    assert len(segments) > 1 and all(len(s.text) <= 100 for s in segments)
    assert all(s.plain.endswith((",", ".")) for s in segments)  # at clause marks
    words = split_document("word " * 200, "plain", SplitLimits(max_chars=60), PAUSES)
    assert (
        all(len(s.text) <= 60 for s in words) and sum(s.plain.count("word") for s in words) == 200
    )


def test_an_unbroken_run_of_chinese_or_thai_is_cut_within_the_speech_estimate() -> None:
    """No space, no punctuation: cut between characters, 500 at a time, each ~150 s by the
    estimate (one token a character) against a segment's 90 s: now cut until each fits."""
    for phrase in ("我们今天在公园里散步看到很多人在跑步天气非常好", "สวัสดีครับยินดีต้อนรับสู่กรุงเทพ"):
        text = (phrase * 100)[:2400]
        limits = SplitLimits(max_chars=1000, max_speech_s=90)
        segments = split_document(text, "plain", limits, PAUSES)
        assert "".join(s.plain for s in segments) == text
        assert all(fits([s.plain], limits, ssml=False) for s in segments)


def test_the_speech_estimate_bounds_a_segment_too() -> None:
    text = "Word " * 400 + "end."
    segments = split_document(text, "plain", SplitLimits(max_chars=10_000, max_speech_s=30), PAUSES)
    assert all(len(s.plain.split()) * 0.3 <= 30 for s in segments)


def test_ssml_breaks_stay_and_replace_the_boundary_pause_and_entities_survive() -> None:
    text = '<speak>A &amp; B said hi. <break time="2s"/> Then more.\n\nNew part.</speak>'
    one = split_document(text, "auto", SplitLimits(), PAUSES)
    assert len(one) == 1 and one[0].text.startswith("<speak>") and "&amp;" in one[0].text
    assert text_of(parse_markup(one[0].text)) == "A & B said hi. Then more. New part."
    split = split_document(text, "ssml", SplitLimits(max_chars=40), PAUSES)
    assert split[1].pause_before_s == 2.0 and split[1].plain == "Then more."
    assert split[2].pause_before_s == 0.6


def test_validate_document_errors_name_field_and_rule() -> None:
    limits = DocumentLimits(max_document_chars=5000, max_segments=2)
    cases = {
        "text: 5,001 characters, limit 5,000": {"text": "x" * 5001},
        "stream: a document is not streamed": {"text": "Hi.", "stream": True},
        "markup: input should be": {"text": "Hi.", "markup": "html"},
        "text: markup <b> is not supported": {"text": "a <b>c</b>"},
        "segments, limit 2 .COSYQ_MAX_DOCUMENT_SEGMENTS": {
            "text": "\n\n".join([SENTENCE * 30] * 2)
        },
        "voice: give either voice or prompt_audio": {
            "text": "Hi.",
            "voice": "a",
            "prompt_audio": "file:///x.wav",
        },
    }
    for expected, data in cases.items():
        with pytest.raises(InvalidRequestError, match=expected.replace("(", r"\(")):
            validate_document(data, limits)


def test_segment_jobs_pass_the_job_gate_and_seeds_are_stable() -> None:
    plan = validate_document(
        {"text": SENTENCE * 100, "voice": "alice", "format": "mp3", "seed": 3}, DocumentLimits()
    )
    for job in plan.jobs:
        assert validate_request(job, RequestLimits()) == job
        assert job.format == "wav" and job.sample_format == "float32" and job.voice == "alice"
    seeds = [segment_seed(3, i) for i in range(len(plan.jobs))]
    assert seeds == [segment_seed(3, i) for i in range(len(plan.jobs))]
    assert len(set(seeds)) == len(seeds) and segment_seed(4, 0) != seeds[0]
    assert all(0 <= s < 2**32 for s in seeds)


def test_the_sentence_rule_is_the_engines() -> None:
    from workers.engine import text_split  # noqa: PLC0415

    assert text_split.split_sentences is split_sentences
    assert split_sentences("Pi is 3.14. Done") == ["Pi is 3.14. ", "Done"]


def test_captions_come_from_the_libraries_formats() -> None:
    cues = [Cue(0.0, 1.25, "Hello."), Cue(1.35, 3725.5, "World.")]
    assert "00:00:01,250" in to_srt(cues) and "01:02:05,500" in to_srt(cues)
    vtt = to_vtt(cues)
    assert vtt.startswith("WEBVTT") and "00:00:01.350 --> 01:02:05.500" in vtt
    with pytest.raises(ValueError, match="captions: 'txt'"):
        render(cues, "txt")


def test_a_cue_text_never_makes_another_cue() -> None:
    """Raw text (CosyVoice 3's cross_lingual reads it as written) keeps its blank lines and a
    line like a cue's timing: each format's parser still reads two cues, the text intact."""
    import srt  # noqa: PLC0415
    import webvtt  # noqa: PLC0415

    forged = "Hi.\n\n2\n00:00:05,000 --> 00:00:09,000\n\n<c.red>Forged</c> & more"
    cues = [Cue(0.0, 1.0, forged), Cue(1.0, 2.0, "Next.")]
    parsed = list(srt.parse(to_srt(cues)))
    assert [c.content for c in parsed] == [
        "Hi. 2 00:00:05,000 -> 00:00:09,000 <c.red>Forged</c> & more",
        "Next.",
    ]
    captions = list(webvtt.from_string(to_vtt(cues)))
    assert [c.text for c in captions] == [
        "Hi.\n2\n00:00:05,000 --&gt; 00:00:09,000\n&lt;c.red&gt;Forged&lt;/c&gt; &amp; more",
        "Next.",
    ]


class _CountingTags:
    """CONTROL_TAG_RE, counting the characters every speech estimate scans through it."""

    def __init__(self, pattern: Any) -> None:
        self.pattern, self.scanned = pattern, 0

    def sub(self, repl: str, text: str) -> str:
        self.scanned += len(text)
        return self.pattern.sub(repl, text)


@pytest.mark.parametrize(
    "text",
    [
        ("word " * 40_000).strip(),  # a transcript without punctuation: cut between words
        ("a, " * 60_000).strip(),  # a long list of clauses in one sentence
        "Yes. " * 40_000,  # many short sentences: one segment takes hundreds of them
    ],
    ids=["run-on", "clauses", "short-sentences"],
)
def test_splitting_reads_each_character_a_few_times_not_once_per_word(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A segment's size grows by its parts' sizes: measured again from its start at each word
    (or short sentence), a 1 MB document without full stops took a minute of the front's CPU
    at submit (each word re-read a segment's 1,000 characters)."""
    counting = _CountingTags(text_markup.CONTROL_TAG_RE)
    monkeypatch.setattr(text_markup, "CONTROL_TAG_RE", counting)
    segments = split_document(text, "plain", SplitLimits(), PAUSES)
    assert " ".join(s.plain for s in segments).split() == text.split()
    assert all(len(s.text) <= SplitLimits().max_chars for s in segments)
    assert counting.scanned <= 8 * len(text)  # each word a few times (was 150-230 times)


def test_segments_keep_within_the_breaks_a_job_may_hold() -> None:
    """A paragraph boundary inside a segment is a <break>: a list of short paragraphs is cut
    into segments that each pass the job gate's COSYQ_MAX_BREAKS (and SSML's own breaks too)."""
    limits = DocumentLimits(split=SplitLimits(max_breaks=10), request=RequestLimits(max_breaks=10))
    for text in ("Yes.\n\n" * 200, "<speak>" + 'Yes.<break time="0ms"/>' * 200 + "</speak>"):
        plan = validate_document({"text": text}, limits)  # every segment's job validated
        assert all(len(parse_markup(s.text)) <= 2 * 10 + 1 for s in plan.segments)
        assert max(text_markup.words_breaks(parse_markup(s.text)) for s in plan.segments) == 10
        assert sum(s.plain.count("Yes.") for s in plan.segments) == 200
