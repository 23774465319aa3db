"""CosyVoice 3 through the batch session: each request batched with others gives the same
speech tokens as alone (CosyVoice 3's stop set and silent cap on the batched rows too) and a
waveform within CosyVoice 2's tolerance of alone. The helpers are CosyVoice 2's test's."""

from __future__ import annotations

from pathlib import Path

import pytest
import soundfile

from tests.unit.engine.test_batch_session import (  # noqa: F401 (fixtures used by name)
    Tokens,
    assert_same_as_alone,
    mixed_requests,
    one_thread,
    run_all,
    tokens,
)
from workers.engine.api import VoicePrompt
from workers.engine.batch_session import PipelineBatchSession
from workers.engine.pipeline import EngineOptions, SynthesisPipeline, build_engine
from workers.engine.text_split import SplitConfig

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def engine(tiny3_model_dir: Path) -> SynthesisPipeline:
    options = EngineOptions(split=SplitConfig(max_piece_tokens=12, min_tail_tokens=0), flow_steps=2)
    return build_engine(tiny3_model_dir, device="cpu", options=options)


@pytest.fixture(scope="module")
def voices(engine: SynthesisPipeline, tiny3_model_dir: Path) -> tuple[VoicePrompt, VoicePrompt]:
    samples, rate = soundfile.read(tiny3_model_dir / "prompt.wav", dtype="float32")
    transcript = (tiny3_model_dir / "prompt.txt").read_text().strip()
    first = engine.extract_voice(samples, int(rate), transcript)
    second = engine.extract_voice(samples[: samples.shape[0] * 2 // 3], int(rate), "Some words.")
    return first, second


def test_a_mixed_cosyvoice3_batch_matches_each_request_alone(
    engine: SynthesisPipeline,
    voices: tuple[VoicePrompt, VoicePrompt],
    tokens: Tokens,  # noqa: F811 (the fixture imported above)
) -> None:
    requests = mixed_requests(voices)
    session = engine.open_batch_session(len(requests))
    assert isinstance(session, PipelineBatchSession)
    outputs = run_all(session, requests)
    assert max(o.batch_size for o in outputs) > 1
    assert_same_as_alone(engine, requests, outputs, tokens)
