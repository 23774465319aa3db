"""The pipeline's batch session against the alone path (tiny model, fp32, CPU).

Every request batched with others must give the same speech tokens as alone and a waveform
within 1e-4 max abs: every mode, mixed lengths, two voices, speeds, multi-piece texts, rows
joining while others decode. Failures stay with their own request.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import torch

from shared.errors import EmptyTextError, InvalidRequestError
from workers.engine.api import SynthesisInput, SynthesisOutput, VoicePrompt
from workers.engine.batch_session import PipelineBatchSession
from workers.engine.batching import BatchingEngine, SequentialSession, open_batch_session
from workers.engine.pipeline import EngineOptions, SynthesisPipeline, build_engine
from workers.engine.requests import RequestPlan
from workers.engine.text_split import SplitConfig

pytestmark = pytest.mark.timeout(600)  # dozens of syntheses each, on shared, loaded cores
TOLERANCE = 1e-4  # the bound on |batched - alone|; never loosened
LONG = "The first sentence is here. A second one follows it. And then a third, longer one."
# The flow solves in 2 Euler steps (the model's 10 are the same arithmetic repeated): what is
# compared, a batched row against its alone run, does not depend on the count.
FLOW_STEPS = 2
# One sentence a piece: LONG is 3 pieces (13, 14, 20 tokens; at 12 a sentence was cut in two)
SMALL_PIECES = SplitConfig(max_piece_tokens=20, min_tail_tokens=0)


def tiny_engine(
    model_dir: Path, *, dtype: str = "fp32", hash_cache_dir: Path | None = None, **options: Any
) -> SynthesisPipeline:
    """The tiny model on the CPU, its flow in FLOW_STEPS steps, with these EngineOptions."""
    chosen = EngineOptions(flow_steps=FLOW_STEPS, **options)
    return build_engine(
        model_dir, device="cpu", dtype=dtype, options=chosen, hash_cache_dir=hash_cache_dir
    )


Tokens = dict[tuple[str, int | None, str], list[list[int]]]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: on shared, loaded cores OpenMP's spinning threads made these
    (many small ops) ~40x slower; the arithmetic compared is the same either way."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> SynthesisPipeline:
    """Small pieces (one sentence each) so long texts are multi-piece requests."""
    hashes = tmp_path_factory.mktemp("hashes")
    return tiny_engine(tiny_model_dir, hash_cache_dir=hashes, split=SMALL_PIECES)


@pytest.fixture(scope="module")
def voices(engine: SynthesisPipeline, tiny_model_dir: Path) -> tuple[VoicePrompt, VoicePrompt]:
    samples, rate = soundfile.read(tiny_model_dir / "prompt.wav", dtype="float32")
    transcript = (tiny_model_dir / "prompt.txt").read_text().strip()
    first = engine.extract_voice(samples, int(rate), transcript)
    second = engine.extract_voice(samples[: samples.shape[0] * 2 // 3], int(rate), "Some words.")
    assert first.speech_tokens.shape != second.speech_tokens.shape
    return first, second


@pytest.fixture
def tokens(engine: SynthesisPipeline, monkeypatch: pytest.MonkeyPatch) -> Iterator[Tokens]:
    """Records every piece's speech tokens per request (alone and batched runs alike)."""
    seen: Tokens = {}
    original = SynthesisPipeline.piece_audio

    def recording(
        self: SynthesisPipeline, ids: np.ndarray, plan: RequestPlan, mel: np.ndarray | None = None
    ) -> np.ndarray:
        r = plan.request
        seen.setdefault((r.text, r.seed, r.mode), []).append([int(i) for i in ids])
        return original(self, ids, plan, mel)

    monkeypatch.setattr(SynthesisPipeline, "piece_audio", recording)
    yield seen


def mixed_requests(voices: tuple[VoicePrompt, VoicePrompt]) -> list[SynthesisInput]:
    a, b = voices
    return [
        SynthesisInput(text="Hello, a short test.", prompt=a, seed=1),
        SynthesisInput(
            text="Cross lingual, quick.", prompt=b, mode="cross_lingual", seed=2, speed=1.5
        ),
        SynthesisInput(
            text="Follow the instruction now.",
            prompt=a,
            mode="instruct2",
            instruction="Speak slowly and calmly.",
            seed=3,
            speed=0.8,
        ),
        SynthesisInput(text=LONG, prompt=b, seed=4),
        SynthesisInput(text="Yes.", prompt=b, seed=5),
        SynthesisInput(text=LONG, prompt=a, mode="cross_lingual", seed=6, speed=1.25),
    ]


ALONE: dict[tuple[object, ...], tuple[list[list[int]], SynthesisOutput]] = {}


def alone_run(
    engine: SynthesisPipeline, request: SynthesisInput, tokens: Tokens
) -> tuple[list[list[int]], SynthesisOutput]:
    """The request run alone (cached per engine and request: the alone path is deterministic)."""
    key = (
        id(engine),
        request.text,
        request.seed,
        request.mode,
        request.instruction,
        request.speed,
        request.prompt.transcript,
    )
    if key not in ALONE:
        tokens.clear()
        output = engine.synthesize(request)
        ALONE[key] = (tokens[(request.text, request.seed, request.mode)], output)
    return ALONE[key]


def assert_same_as_alone(
    engine: SynthesisPipeline,
    requests: list[SynthesisInput],
    outputs: list[SynthesisOutput],
    tokens: Tokens,
) -> None:
    batched = {key: list(value) for key, value in tokens.items()}
    for request, output in zip(requests, outputs, strict=True):
        alone_tokens, alone = alone_run(engine, request, tokens)
        key = (request.text, request.seed, request.mode)
        assert batched[key] == alone_tokens, f"speech tokens differ for {key}"
        assert output.speech_tokens == alone.speech_tokens
        assert output.samples.shape == alone.samples.shape
        worst = float(np.abs(output.samples - alone.samples).max(initial=0.0))
        assert worst <= TOLERANCE, f"{key}: max abs {worst}"


def run_all(session: Any, requests: list[SynthesisInput]) -> list[SynthesisOutput]:
    futures = [session.submit(r) for r in requests]
    try:
        return [f.result(timeout=600) for f in futures]
    finally:
        session.close()


def test_the_pipeline_is_a_batching_engine(engine: SynthesisPipeline) -> None:
    assert isinstance(engine, BatchingEngine)
    session = open_batch_session(engine, 4)
    assert isinstance(session, PipelineBatchSession) and session.max_batch == 4
    session.close()
    alone = open_batch_session(engine, 1)
    assert isinstance(alone, SequentialSession)
    alone.close()
    with pytest.raises(ValueError, match="exceeds the engine's max_batch 16"):
        engine.open_batch_session(17)


def test_a_mixed_batch_matches_each_request_alone(
    engine: SynthesisPipeline, voices: tuple[VoicePrompt, VoicePrompt], tokens: Tokens
) -> None:
    requests = mixed_requests(voices)
    outputs = run_all(engine.open_batch_session(len(requests)), requests)
    assert max(o.batch_size for o in outputs) == len(requests)
    pieces = len(engine.frontend.pieces(LONG))
    assert pieces >= 3
    assert all(len(done) == pieces for key, done in tokens.items() if key[0] == LONG)
    assert_same_as_alone(engine, requests, outputs, tokens)


def test_newcomers_join_while_others_decode(
    engine: SynthesisPipeline, voices: tuple[VoicePrompt, VoicePrompt], tokens: Tokens
) -> None:
    """A batch of 3: six requests arrive in two waves; later ones take freed rows."""
    requests = mixed_requests(voices)
    session = engine.open_batch_session(3)
    first = [session.submit(r) for r in requests[:3]]
    assert session.in_flight() >= 1
    first[0].result(timeout=600)
    rest = [session.submit(r) for r in requests[3:]]
    outputs = [f.result(timeout=600) for f in first + rest]
    session.close()
    assert session.in_flight() == 0
    assert all(1 <= o.batch_size <= 3 for o in outputs)
    assert_same_as_alone(engine, requests, outputs, tokens)


def test_a_bad_request_fails_alone(
    engine: SynthesisPipeline, voices: tuple[VoicePrompt, VoicePrompt], tokens: Tokens
) -> None:
    a, _ = voices
    good = mixed_requests(voices)[:3]
    bad = [
        SynthesisInput(text="Fine text.", prompt=a, speed=-1.0, seed=9),
        SynthesisInput(text="  ", prompt=a, seed=10),
        SynthesisInput(
            text="No transcript.", prompt=dataclasses.replace(a, transcript=""), seed=11
        ),
    ]
    session = engine.open_batch_session(8)
    futures = [session.submit(r) for r in [bad[0], good[0], bad[1], good[1], bad[2], good[2]]]
    errors = [futures[i].exception(timeout=600) for i in (0, 2, 4)]
    assert isinstance(errors[0], InvalidRequestError) and "speed" in str(errors[0])
    assert isinstance(errors[1], EmptyTextError)
    assert isinstance(errors[2], InvalidRequestError) and "transcript" in str(errors[2])
    outputs = [futures[i].result(timeout=600) for i in (1, 3, 5)]
    session.close()
    assert_same_as_alone(engine, good, outputs, tokens)


def test_an_exception_in_a_batched_step_reruns_each_request_alone(
    engine: SynthesisPipeline,
    voices: tuple[VoicePrompt, VoicePrompt],
    tokens: Tokens,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A poisoned request breaks the batched step; alone, only it fails."""
    requests = mixed_requests(voices)[:3]  # single-piece: nothing recorded before the rerun
    poison = SynthesisInput(text="Poison pill.", prompt=voices[0], seed=13)
    session = engine.open_batch_session(8)
    assert isinstance(session, PipelineBatchSession)
    steps = session.decoder.step

    def step() -> Any:
        jobs = [row.key for row in session.decoder.rows]
        if any(getattr(job, "request", None) is poison for job in jobs):
            raise RuntimeError("batched step blew up")
        return steps()

    monkeypatch.setattr(session.decoder, "step", step)
    original_planned = engine.synthesize_planned
    alone: list[str] = []

    def synthesize_planned(plan: RequestPlan) -> SynthesisOutput:
        alone.append(plan.request.text)
        if plan.request.text == poison.text:
            raise RuntimeError("the poison fails alone too")
        return original_planned(plan)

    monkeypatch.setattr(engine, "synthesize_planned", synthesize_planned)
    futures = [session.submit(r) for r in [*requests[:2], poison, *requests[2:]]]
    assert "fails alone too" in str(futures[2].exception(timeout=600))
    outputs = [f.result(timeout=600) for f in futures[:2] + futures[3:]]
    session.close()
    assert poison.text in alone and len(alone) >= 2  # its neighbours were rerun one by one
    monkeypatch.setattr(engine, "synthesize_planned", original_planned)
    assert_same_as_alone(engine, requests, outputs, tokens)


def held_alone(
    engine: SynthesisPipeline, monkeypatch: pytest.MonkeyPatch, held_text: str
) -> tuple[threading.Event, threading.Event]:
    """Requests with `held_text`, run alone, set the first event (entered), wait for the gate."""
    entered, gate = threading.Event(), threading.Event()
    original = engine.synthesize_planned

    def synthesize_planned(plan: RequestPlan) -> SynthesisOutput:
        if plan.request.text == held_text:
            entered.set()
            assert gate.wait(timeout=600), "never released"
        return original(plan)

    monkeypatch.setattr(engine, "synthesize_planned", synthesize_planned)
    return entered, gate


@pytest.fixture(scope="module")
def small(tiny_model_dir: Path) -> SynthesisPipeline:  # rows of 200 positions, shared
    return tiny_engine(tiny_model_dir, batch_max_positions=200)


def test_a_request_too_long_for_a_row_does_not_stall_the_batch(
    small: SynthesisPipeline,
    voices: tuple[VoicePrompt, VoicePrompt],
    tokens: Tokens,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """While the long request runs alone (held there), the others decode and finish."""
    a, b = voices
    requests = [  # zero_shot (its prompt's speech tokens) needs > 200 positions; these fit
        mixed_requests(voices)[0],
        SynthesisInput(text="Yes.", prompt=b, mode="cross_lingual", seed=21),
        SynthesisInput(text="No.", prompt=a, mode="cross_lingual", seed=22),
    ]
    _, gate = held_alone(small, monkeypatch, requests[0].text)
    session = small.open_batch_session(4)
    futures = [session.submit(r) for r in requests]
    try:
        others = [f.result(timeout=300) for f in futures[1:]]  # the long one is still held
        assert not futures[0].done() and session.in_flight() == 1
    finally:
        gate.set()
        outputs = [futures[0].result(timeout=600), *others]
        session.close()
    assert session.in_flight() == 0 and outputs[0].batch_size == 1
    assert_same_as_alone(small, requests, outputs, tokens)


def test_a_rerun_after_a_failed_step_does_not_stall_newcomers(
    engine: SynthesisPipeline,
    voices: tuple[VoicePrompt, VoicePrompt],
    tokens: Tokens,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A poisoned step's requests rerun alone beside the batch (held here); a request that
    arrives meanwhile is decoded in the batch and finishes."""
    poison = SynthesisInput(text="Poison pill.", prompt=voices[0], seed=13)
    later = mixed_requests(voices)[:2]
    session = engine.open_batch_session(4)
    assert isinstance(session, PipelineBatchSession)
    steps = session.decoder.step

    def step() -> Any:
        if any(getattr(row.key, "request", None) is poison for row in session.decoder.rows):
            raise RuntimeError("batched step blew up")
        return steps()

    monkeypatch.setattr(session.decoder, "step", step)
    entered, gate = held_alone(engine, monkeypatch, poison.text)
    first = session.submit(poison)
    try:
        assert entered.wait(timeout=300)  # its step failed; it reruns alone, held there
        rest = [session.submit(r) for r in later]
        outputs = [f.result(timeout=300) for f in rest]
        assert not first.done()
    finally:
        gate.set()
        assert first.result(timeout=600).speech_tokens > 0  # alone it does not blow up
        session.close()
    assert_same_as_alone(engine, later, outputs, tokens)


def test_a_piece_longer_than_a_row_runs_alone(
    small: SynthesisPipeline, voices: tuple[VoicePrompt, VoicePrompt], tokens: Tokens
) -> None:
    requests = mixed_requests(voices)[:3]  # zero_shot rows need > 200 positions
    outputs = run_all(small.open_batch_session(4), requests)
    assert outputs[0].batch_size == 1
    assert_same_as_alone(small, requests, outputs, tokens)


def test_a_cancelled_future_is_skipped_and_close_drains(
    engine: SynthesisPipeline, voices: tuple[VoicePrompt, VoicePrompt]
) -> None:
    requests = mixed_requests(voices)[:3]
    gate = threading.Event()
    session = engine.open_batch_session(2)
    assert isinstance(session, PipelineBatchSession)
    original: Callable[..., Any] = session.decoder.step

    def held_step() -> Any:
        gate.wait(timeout=60)
        return original()

    session.decoder.step = held_step  # type: ignore[method-assign]
    futures: list[Future[SynthesisOutput]] = [session.submit(r) for r in requests]
    assert futures[2].cancel()  # still queued: batch of 2
    gate.set()
    session.close()
    assert futures[2].cancelled() and all(f.result().speech_tokens for f in futures[:2])
    assert session.in_flight() == 0
    with pytest.raises(RuntimeError, match="closed"):
        session.submit(requests[0])


@pytest.fixture(scope="module")
def forced_engine(tiny_model_dir: Path) -> SynthesisPipeline:
    """Every piece exactly 30 tokens: rows finish together and share one padded flow call."""
    return tiny_engine(tiny_model_dir, split=SMALL_PIECES, forced_speech_tokens=30)


def count_flow_batches(flow: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The pieces of each `mels` call the flow stage gets from now on (the list fills up)."""
    batches: list[int] = []
    mels = flow.mels

    def counting(pieces: list[Any], *, between_steps: Any = None) -> list[np.ndarray]:
        batches.append(len(pieces))
        return mels(pieces, between_steps=between_steps)  # type: ignore[no-any-return]

    monkeypatch.setattr(flow, "mels", counting)
    return batches


def test_rows_finishing_together_share_one_flow_batch(
    forced_engine: SynthesisPipeline,
    voices: tuple[VoicePrompt, VoicePrompt],
    tokens: Tokens,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    flow = forced_engine.flow
    assert getattr(flow, "batches", False)
    batches = count_flow_batches(flow, monkeypatch)
    requests = mixed_requests(voices)
    outputs = run_all(forced_engine.open_batch_session(len(requests)), requests)
    assert max(batches) >= 4  # first pieces of every request together (voices, speeds differ)
    assert_same_as_alone(forced_engine, requests, outputs, tokens)


def test_a_failing_flow_batch_reruns_each_piece_alone(
    forced_engine: SynthesisPipeline,
    voices: tuple[VoicePrompt, VoicePrompt],
    tokens: Tokens,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(pieces: list[Any], *, between_steps: Any = None) -> list[np.ndarray]:
        raise RuntimeError("batched flow blew up")

    monkeypatch.setattr(forced_engine.flow, "mels", broken)
    requests = mixed_requests(voices)[:3]
    outputs = run_all(forced_engine.open_batch_session(3), requests)
    assert_same_as_alone(forced_engine, requests, outputs, tokens)


def test_batched_pieces_report_the_stops_and_spans_of_alone(
    engine: SynthesisPipeline, voices: tuple[VoicePrompt, VoicePrompt]
) -> None:
    """How each piece's LLM ended and where it lies: the quality check's input, batched or not."""
    request = SynthesisInput(text=LONG, prompt=voices[0], seed=3)
    alone = engine.synthesize(request)
    other = dataclasses.replace(request, seed=4)
    batched = run_all(engine.open_batch_session(2), [request, other])[0]
    pieces = engine.frontend.pieces(LONG)
    assert len(alone.pieces) == len(pieces) and alone.seed == 3
    assert alone.text_tokens == sum(len(piece.ids) for piece in pieces)
    assert {p.stop for p in alone.pieces} <= {"stop_token", "length_bound"}
    reports = [(p.text, p.stop, p.speech_tokens, p.start, p.end) for p in alone.pieces]
    assert [(p.text, p.stop, p.speech_tokens, p.start, p.end) for p in batched.pieces] == reports
    ends = [0] + [edge for p in alone.pieces for edge in (p.start, p.end)]
    assert ends == sorted(ends) and ends[-1] <= alone.samples.size
    assert (batched.seed, batched.text_tokens) == (3, alone.text_tokens)
    assert [p.text for p in batched.pieces] == [p.text for p in pieces]


def test_in_bf16_a_batched_request_is_bit_for_bit_its_alone_run(
    tiny_model_dir: Path, voices: tuple[VoicePrompt, VoicePrompt]
) -> None:
    """Same request + seed, same audio, whichever jobs shared its batch: in bf16 the padded
    flow would move samples by a rounding step, so each row's flow runs alone there."""
    half = tiny_engine(tiny_model_dir, dtype="bf16")
    assert not getattr(half.flow, "batches", True)  # per-row flow calls in bf16
    requests = mixed_requests(voices)[:4]
    outputs = run_all(half.open_batch_session(len(requests)), requests)
    assert max(o.batch_size for o in outputs) > 1
    for request, output in zip(requests, outputs, strict=True):
        alone = half.synthesize(request)
        assert output.speech_tokens == alone.speech_tokens
        assert np.array_equal(output.samples, alone.samples), request.text


def test_in_fp32_the_padded_flow_batch_stays_within_tolerance_of_alone(
    forced_engine: SynthesisPipeline, voices: tuple[VoicePrompt, VoicePrompt], tokens: Tokens
) -> None:
    """fp32 keeps the one padded flow call; its rows are within TOLERANCE of alone."""
    assert getattr(forced_engine.flow, "batches", False)
    requests = mixed_requests(voices)[:4]
    outputs = run_all(forced_engine.open_batch_session(len(requests)), requests)
    assert_same_as_alone(forced_engine, requests, outputs, tokens)


def test_in_bf16_the_joined_flow_batches_pieces_and_keeps_each_requests_speech(
    tiny_model_dir: Path, voices: tuple[VoicePrompt, VoicePrompt], monkeypatch: pytest.MonkeyPatch
) -> None:
    """COSYQ_BATCH_FLOW=joined: one flow call for pieces finishing together, in bf16 too; each
    request keeps its alone run's speech tokens and length, its samples within rounding."""
    options = {"forced_speech_tokens": 30, "join_reduced_precision_flow": True}
    half = tiny_engine(tiny_model_dir, dtype="bf16", split=SMALL_PIECES, **options)
    flow = half.flow
    assert getattr(flow, "batches", False)
    batches = count_flow_batches(flow, monkeypatch)
    requests = mixed_requests(voices)[:4]
    outputs = run_all(half.open_batch_session(len(requests)), requests)
    assert max(batches) > 1
    for request, output in zip(requests, outputs, strict=True):
        alone = half.synthesize(request)
        assert output.speech_tokens == alone.speech_tokens
        assert output.samples.shape == alone.samples.shape
        # The tiny random model turns a bf16 rounding step into 9-16% RMS of its audio
        # (measured); another request's audio in its place would be ~140%.
        error = float(np.sqrt(np.mean((output.samples - alone.samples) ** 2)))
        assert error <= 0.5 * float(np.sqrt(np.mean(alone.samples**2))), request.text
