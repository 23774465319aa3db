"""A Chinese, Japanese or Korean document's segments are sized by the worker's own estimate
(`SpeechCount`: 0.2 s a Han character or Hangul syllable, 0.125 s a kana), not at a token a
character (0.3 s, punctuation included), which cut a Chinese document at ~300 characters
where the worker's bound holds ~450; and no segment is over the worker's bound: each is
accepted whole (`split_past_limit` off) by the tiny model's engine at the deployment's bound,
its estimate after normalisation within the segment's limit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from shared.documents import DocumentLimits, validate_document
from shared.jobs import RequestLimits, validate_request
from shared.text_markup import SpeechCount
from workers.engine.api import SynthesisInput, VoicePrompt
from workers.engine.pipeline import EngineOptions, build_engine
from workers.engine.speech_bound import piece_speech

LIMITS = DocumentLimits()
CORPUS = Path(__file__).parents[2] / "data" / "corpus"
CJK_DOCUMENTS = {
    "zh": ["zh_novel.txt", "zh_commas.txt", "classical.txt"],
    "yue": ["yue.txt"],
    "ja": ["ja.txt"],
    "ko": ["ko.txt"],
    "zh_mixed": ["zh_mixed.txt"],
    "zh_doc": ["zh_doc.md"],
}
PROMPT = VoicePrompt(
    speech_tokens=np.zeros(25, dtype=np.int32),
    mel=np.zeros((50, 80), dtype=np.float32),
    embedding=np.zeros(192, dtype=np.float32),
    transcript="一段测试提示。",
)
PROSE = "".join(
    line.strip()
    for name in ("zh_novel.txt", "zh_commas.txt")
    for line in (CORPUS / name).read_text(encoding="utf-8").splitlines()
)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Any:
    """The tiny engine at the deployment's default bound (150 s), refusing what is over it."""
    options = EngineOptions(max_speech_seconds=RequestLimits().max_speech_seconds)
    return build_engine(tiny_model_dir, device="cpu", options=options)


def worker_seconds(engine: Any, job: dict[str, Any]) -> float:
    """The worker's estimate of one segment's job, after normalisation; refused if over."""
    request = validate_request(job, LIMITS.request)
    data = SynthesisInput(text=request.text, prompt=PROMPT, language=request.language)
    pieces = engine.text_pieces(data)  # InvalidRequestError when over the bound
    count = sum((piece_speech(p, engine.frontend.count_tokens) for p in pieces), SpeechCount())
    return count.seconds(sum(p.pause_before_s or 0.0 for p in pieces) + pieces[-1].pause_after_s)


@pytest.mark.parametrize("kind", CJK_DOCUMENTS)
def test_no_segment_of_a_cjk_document_is_over_the_workers_bound(engine: Any, kind: str) -> None:
    names = CJK_DOCUMENTS[kind]
    text = "\n\n".join((CORPUS / name).read_text(encoding="utf-8") for name in names) * 3
    markup = "markdown" if names[0].endswith(".md") else "plain"
    plan = validate_document({"text": text, "markup": markup}, LIMITS)
    assert len(plan.jobs) > 1
    for job in plan.jobs:
        seconds = worker_seconds(engine, job.model_dump(mode="json"))
        assert seconds <= LIMITS.split.max_speech_s <= RequestLimits().max_speech_seconds


@pytest.mark.parametrize("length", [300, 400, 440])
def test_chinese_prose_is_one_segment_up_to_the_bound_as_the_worker_counts_it(
    engine: Any, length: int
) -> None:
    """440 characters of prose are 88 s to the worker: one segment, not two (at 0.3 s a
    character and a punctuation mark they were ~115 s)."""
    text = PROSE[:length]
    plan = validate_document({"text": text}, LIMITS)
    assert len(plan.jobs) == 1
    assert worker_seconds(engine, plan.jobs[0].model_dump(mode="json")) <= 90.0


def test_a_long_chinese_paragraph_fills_each_segment_near_the_bound(engine: Any) -> None:
    """Sentences of a novel (~30 characters each): a segment ends within a sentence of the
    bound, but where the next unit is long (its opening) and at the end (old: ~50 s each, at a
    token a character and a punctuation mark)."""
    novel = "".join((CORPUS / "zh_novel.txt").read_text(encoding="utf-8").split())
    plan = validate_document({"text": novel * 4}, LIMITS)
    filled = [worker_seconds(engine, job.model_dump(mode="json")) for job in plan.jobs]
    assert all(seconds <= LIMITS.split.max_speech_s for seconds in filled)
    full = [seconds > 0.8 * LIMITS.split.max_speech_s for seconds in filled]
    assert sum(full) >= len(filled) - 2 >= 2, filled
