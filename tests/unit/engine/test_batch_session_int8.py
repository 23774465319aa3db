"""The int8 LLM (`COSYQ_LLM_PRECISION=int8`, the ONNX Runtime step) through the batch session:
a batching worker's requests decode as rows of `OrtBatchDecoder`, not one at a time, and each
request batched with others gives the same speech tokens as the same request alone on int8 and
a waveform within CosyVoice 2's batched tolerance of it. The helpers are the fp32 test's."""

from __future__ import annotations

from pathlib import Path

import pytest
import soundfile
from structlog.testing import capture_logs

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
from workers.model.llm.decoder_choice import open_row_decoder
from workers.model.llm.ort_batch import OrtBatchDecoder
from workers.model.llm.ort_decoder import OrtSpeechLM

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> SynthesisPipeline:
    options = EngineOptions(
        split=SplitConfig(max_piece_tokens=12, min_tail_tokens=0),
        flow_steps=2,
        llm_precision="int8",
        ort_cache_dir=tmp_path_factory.mktemp("graphs"),
    )
    hashes = tmp_path_factory.mktemp("hashes")
    return build_engine(tiny_model_dir, device="cpu", options=options, hash_cache_dir=hashes)


@pytest.fixture(scope="module")
def voices(engine: SynthesisPipeline, tiny_model_dir: Path) -> tuple[VoicePrompt, VoicePrompt]:
    samples, rate = soundfile.read(tiny_model_dir / "prompt.wav", dtype="float32")
    transcript = (tiny_model_dir / "prompt.txt").read_text().strip()
    first = engine.extract_voice(samples, int(rate), transcript)
    second = engine.extract_voice(samples[: samples.shape[0] * 2 // 3], int(rate), "Some words.")
    return first, second


def test_an_int8_batching_worker_decodes_rows_together(engine: SynthesisPipeline) -> None:
    assert isinstance(getattr(engine.llm, "model", None), OrtSpeechLM)
    with capture_logs() as logs:
        session = engine.open_batch_session(4)
    session.close()
    assert isinstance(session, PipelineBatchSession)
    assert isinstance(session.decoder, OrtBatchDecoder) and session.decoder.cache.rows == 4
    assert not [e for e in logs if e["event"] == "batch_session_sequential"]
    assert open_row_decoder(object(), 2, 64) is None  # an LLM with no batched decode: sequential


def test_a_mixed_int8_batch_matches_each_request_alone_on_int8(
    engine: SynthesisPipeline,
    voices: tuple[VoicePrompt, VoicePrompt],
    tokens: Tokens,  # noqa: F811 (the fixture imported above)
) -> None:
    requests = mixed_requests(voices)
    outputs = run_all(engine.open_batch_session(len(requests)), requests)
    assert max(o.batch_size for o in outputs) == len(requests)
    assert_same_as_alone(engine, requests, outputs, tokens)


def test_int8_newcomers_join_while_others_decode(
    engine: SynthesisPipeline,
    voices: tuple[VoicePrompt, VoicePrompt],
    tokens: Tokens,  # noqa: F811
) -> None:
    """A batch of 3: six requests in two waves; the later ones take the rows freed."""
    requests = mixed_requests(voices)
    session = engine.open_batch_session(3)
    first = [session.submit(r) for r in requests[:3]]
    first[0].result(timeout=600)
    rest = [session.submit(r) for r in requests[3:]]
    outputs = [f.result(timeout=600) for f in first + rest]
    session.close()
    assert all(1 <= o.batch_size <= 3 for o in outputs)
    assert max(o.batch_size for o in outputs) > 1
    assert_same_as_alone(engine, requests, outputs, tokens)
