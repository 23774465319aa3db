"""`should_stop` on the real pipeline (tiny model, CPU): a request stops at the first step whose
check says stop, alone, streamed, and as one row of a batch whose other row goes on unchanged."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch

from workers.engine.api import SynthesisCanceled, SynthesisInput, VoicePrompt
from workers.engine.pipeline import SynthesisPipeline, build_engine

pytestmark = pytest.mark.timeout(600)
LONG = "The first sentence is here. A second one follows it. And then a third, longer one."


class StopAfter:
    """Says "go on" `n` times, then "stop"; counts the checks."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls > self.n


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> SynthesisPipeline:
    return build_engine(tiny_model_dir, device="cpu", hash_cache_dir=tmp_path_factory.mktemp("h"))


@pytest.fixture(scope="module")
def voice(engine: SynthesisPipeline, tiny_model_dir: Path) -> VoicePrompt:
    samples, rate = soundfile.read(tiny_model_dir / "prompt.wav", dtype="float32")
    transcript = (tiny_model_dir / "prompt.txt").read_text().strip()
    return engine.extract_voice(samples, int(rate), transcript)


def test_alone_the_request_stops_at_the_first_check_that_says_stop(
    engine: SynthesisPipeline, voice: VoicePrompt
) -> None:
    stop = StopAfter(8)
    with pytest.raises(SynthesisCanceled):
        engine.synthesize(SynthesisInput(text=LONG, prompt=voice, seed=1, should_stop=stop))
    assert stop.calls == 9  # asked per piece and per LLM step, and no further once it said stop


def test_a_streamed_request_stops_mid_piece(engine: SynthesisPipeline, voice: VoicePrompt) -> None:
    chunks: list[np.ndarray] = []
    stop = StopAfter(8)
    request = SynthesisInput(text=LONG, prompt=voice, seed=1, should_stop=stop)
    with pytest.raises(SynthesisCanceled):
        engine.synthesize_streaming(request, chunks.append)
    assert stop.calls == 9


def test_a_check_that_never_says_stop_changes_nothing(
    engine: SynthesisPipeline, voice: VoicePrompt
) -> None:
    plain = engine.synthesize(SynthesisInput(text="Hello there.", prompt=voice, seed=3))
    stop = StopAfter(10**9)
    checked = engine.synthesize(
        SynthesisInput(text="Hello there.", prompt=voice, seed=3, should_stop=stop)
    )
    assert stop.calls > plain.speech_tokens  # once per step at least
    assert np.array_equal(plain.samples, checked.samples)


def test_a_canceled_row_leaves_and_the_other_row_is_as_alone(
    engine: SynthesisPipeline, voice: VoicePrompt
) -> None:
    kept = SynthesisInput(text="Hello, a short test.", prompt=voice, seed=2)
    alone = engine.synthesize(kept)
    stop = StopAfter(3)
    doomed = SynthesisInput(text=LONG, prompt=voice, seed=1, should_stop=stop)
    session = engine.open_batch_session(2)
    try:
        futures = [session.submit(doomed), session.submit(kept)]
        with pytest.raises(SynthesisCanceled):
            futures[0].result(timeout=600)
        output = futures[1].result(timeout=600)
    finally:
        session.close()
    assert stop.calls == 4
    assert session.in_flight() == 0
    assert output.speech_tokens == alone.speech_tokens
    assert output.samples.shape == alone.samples.shape
    assert float(np.abs(output.samples - alone.samples).max(initial=0.0)) <= 1e-4
