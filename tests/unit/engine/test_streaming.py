"""The streaming path's parts: hop schedule, HiFT cache and cross-fade, joins, per-request state."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from workers.engine.api import SynthesisInput, VoicePrompt
from workers.engine.assembly import JoinConfig, join_pieces
from workers.engine.flow_chunks import RecomputedFlowChunks
from workers.engine.stream_join import StreamJoiner
from workers.engine.streaming import PieceStream, StreamSchedule, chunk_aligned, hamming


def test_hops_follow_upstream_and_pad_the_first_to_a_chunk_edge() -> None:
    schedule = StreamSchedule()
    assert list(itertools.islice(schedule.hops(0, 25), 5)) == [25, 50, 100, 100, 100]
    assert next(schedule.hops(13, 25)) == 37  # 13 + 37 = 50: a flow chunk edge
    assert next(schedule.hops(25, 25)) == 25
    assert list(itertools.islice(StreamSchedule(first_hop=6, max_hop=12).hops(25, 25), 4)) == [
        6,
        12,
        12,
        12,
    ]
    with pytest.raises(ValueError, match="first_hop <= max_hop"):
        StreamSchedule(first_hop=50, max_hop=25)


@contextlib.contextmanager
def untimed(_stage: str) -> Iterator[None]:
    yield


class LinearFlow:
    """Mel frame j of token i is its id (two frames per token): what a chunk gets is visible."""

    lookahead = 3
    chunk_tokens = 25

    def __init__(self) -> None:
        self.calls: list[tuple[int, int, bool]] = []
        self.prompts: list[VoicePrompt] = []

    def open_stream(
        self, prompt: VoicePrompt, *, cache_max_bytes: int | None = None
    ) -> RecomputedFlowChunks:
        return RecomputedFlowChunks(self, prompt)

    def mel_chunk(
        self, tokens: np.ndarray, prompt: VoicePrompt, *, offset: int, finalize: bool
    ) -> np.ndarray:
        self.calls.append((len(tokens), offset, finalize))
        self.prompts.append(prompt)
        end = len(tokens) if finalize else len(tokens) - self.lookahead
        ids = np.repeat(tokens[offset:end].astype(np.float32), 2)
        return np.tile(ids, (80, 1))


class ConstantVocoder:
    """Each sample is its mel frame's value: the cross-fade of repeated frames is checkable."""

    samples_per_frame = 480

    def __init__(self) -> None:
        self.prefixes: list[int] = []

    def waveform_chunk(
        self, mel: np.ndarray, generator: torch.Generator, source_prefix: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        self.prefixes.append(0 if source_prefix is None else source_prefix.size)
        wav = np.repeat(mel[0], self.samples_per_frame).astype(np.float32)
        return wav, wav.copy()


def prompt(tokens: int) -> VoicePrompt:
    return VoicePrompt(
        np.zeros(tokens, np.int32), np.zeros((2 * tokens, 80), np.float32), np.zeros(192), ""
    )


def test_piece_stream_chunks_caches_and_fade() -> None:
    flow, vocoder = LinearFlow(), ConstantVocoder()
    stream = PieceStream(
        flow,
        vocoder,
        prompt(25),
        torch.Generator(),
        schedule=StreamSchedule(first_hop=25, max_hop=100),
        timed=untimed,
    )
    ones = [1.0] * 120  # every token id 1: any fade other than the Hamming pair shows
    chunks = [c for t in ones if (c := stream.push(int(t))) is not None]
    chunks.append(stream.finish())
    assert stream.chunk_tokens == [25, 50, 45]  # the last: the 42 left + the 3 look-ahead
    assert flow.calls == [(28, 0, False), (78, 25, False), (120, 75, True)]
    assert vocoder.prefixes == [0, 3840, 3840]  # each later chunk starts with the cached source
    assert [c.size for c in chunks] == [25 * 960 - 3840, 50 * 960, 45 * 960 + 3840]
    audio = np.concatenate(chunks)
    assert audio.size == 120 * 960  # every frame once
    window = hamming(2 * 3840)
    overlap = window[:3840] + window[3840:]  # a constant signal faded with itself
    np.testing.assert_allclose(audio[25 * 960 - 3840 : 25 * 960], overlap, rtol=1e-6)
    np.testing.assert_array_equal(audio[: 25 * 960 - 3840], 1.0)


def test_reference_call_schedule() -> None:
    """The reference call (13 prompt tokens, 40 tokens): a first hop of 25 + 12 = 37 tokens
    ends on the flow's chunk edge at 50; the last, partly full chunk has the 3 left."""
    flow = LinearFlow()
    stream = PieceStream(
        flow,
        ConstantVocoder(),
        prompt(13),
        torch.Generator(),
        schedule=StreamSchedule(),
        timed=untimed,
    )
    for _ in range(40):
        stream.push(1)
    stream.finish()
    assert stream.chunk_tokens == [37, 3]
    assert flow.calls == [(40, 0, False), (40, 37, True)]


def counting_prompt(tokens: int) -> VoicePrompt:
    """Token i is i, its two mel frames hold i: what a trim kept is visible."""
    ids = np.arange(tokens, dtype=np.int32)
    mel = np.repeat(ids.astype(np.float32), 2)[:, None] * np.ones((1, 80), np.float32)
    return VoicePrompt(ids, mel, np.ones(192, np.float32), "what it says")


def test_a_chunk_aligned_prompt_drops_its_first_tokens_and_their_frames() -> None:
    aligned = chunk_aligned(counting_prompt(63), 25)  # 63 = 2 chunks + 13
    assert aligned.speech_tokens.tolist() == list(range(13, 63))
    assert aligned.mel.shape == (100, 80) and aligned.mel[0, 0] == 13 and aligned.mel[-1, 0] == 62
    assert aligned.transcript == "what it says" and aligned.embedding.shape == (192,)
    whole = counting_prompt(50)
    assert chunk_aligned(whole, 25) is whole  # already on an edge
    short = counting_prompt(20)
    assert chunk_aligned(short, 25) is short  # less than a chunk: kept whole


def test_an_aligned_prompt_takes_the_pad_out_of_the_first_hop() -> None:
    """COSYQ_STREAM_ALIGN_PROMPT: 38 prompt tokens would pad the first hop to 37; aligned, the
    flow's prompt is the last 25 and the first chunk comes after 25 tokens (+3 look-ahead)."""
    flow = LinearFlow()
    stream = PieceStream(
        flow,
        ConstantVocoder(),
        counting_prompt(38),
        torch.Generator(),
        schedule=StreamSchedule(align_prompt=True),
        timed=untimed,
    )
    chunks = [c for _ in range(60) if (c := stream.push(1)) is not None]
    assert len(chunks) == 1 and flow.calls[0] == (28, 0, False)
    assert flow.prompts[0].speech_tokens.tolist() == list(range(13, 38))
    stream.finish()
    assert stream.chunk_tokens == [25, 35]
    padded = PieceStream(
        LinearFlow(),
        ConstantVocoder(),
        counting_prompt(38),
        torch.Generator(),
        schedule=StreamSchedule(),
        timed=untimed,
    )
    assert padded.hop == 37  # the default keeps upstream's padded first hop


def test_piece_stream_with_fewer_tokens_than_one_hop_is_one_final_chunk() -> None:
    flow = LinearFlow()
    stream = PieceStream(
        flow,
        ConstantVocoder(),
        prompt(25),
        torch.Generator(),
        schedule=StreamSchedule(),
        timed=untimed,
    )
    assert all(stream.push(7) is None for _ in range(10))
    assert stream.finish().size == 10 * 960 and flow.calls == [(10, 0, True)]


@pytest.mark.parametrize("seed", range(6))
def test_stream_joiner_equals_join_pieces(seed: int) -> None:
    rng = np.random.default_rng(seed)
    count = int(rng.integers(1, 4))
    pieces = [
        rng.standard_normal(int(rng.integers(0, 3000))).astype(np.float32) for _ in range(count)
    ]
    gaps = [None if rng.random() < 0.5 else float(rng.random() * 0.01) for _ in pieces[1:]]
    lead, tail = (0.0, 0.0) if seed % 2 else (0.002, 0.003)
    config = JoinConfig(gap_s=0.004, fade_s=0.01)
    expected = join_pieces(pieces, 24000, config, gaps=gaps, lead_s=lead, tail_s=tail)
    emitted: list[np.ndarray] = []
    joiner = StreamJoiner(count, 24000, config, emitted.append, gaps=gaps, lead_s=lead, tail_s=tail)
    for piece in pieces:
        joiner.start_piece()
        cuts = np.sort(rng.integers(0, piece.size + 1, size=int(rng.integers(0, 5))))
        for part in np.split(piece, cuts):
            joiner.feed(part)
        joiner.end_piece()
    whole = joiner.finish()
    np.testing.assert_array_equal(whole, expected)
    np.testing.assert_array_equal(np.concatenate(emitted) if emitted else whole, whole)


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Two OpenMP threads on a crowded 2-core machine run the tiny flow ~15x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def quiet_prompt(tokens: int = 25) -> VoicePrompt:
    return VoicePrompt(
        speech_tokens=np.full(tokens, 7, np.int32),
        mel=np.full((2 * tokens, 80), -6.0, np.float32),
        embedding=np.ones(192, np.float32),
        transcript="",
    )


@pytest.mark.timeout(600)  # three tiny-model runs; slow on a busy machine
@pytest.mark.usefixtures("one_thread")
def test_three_streamed_requests_of_one_engine_stream_alike(tiny_engine: Any) -> None:
    """Per-request state: the second and third request start with the first hop again, and the
    same seed gives the same samples; the output is the chunks concatenated."""
    request = SynthesisInput(text="Hello.", prompt=quiet_prompt(), mode="cross_lingual", seed=5)
    runs = []
    for _ in range(3):
        got: list[np.ndarray] = []
        samples, state, sizes = tiny_engine.run_streaming(request, got.append, forced_length=30)
        assert sizes == [c.size for c in got]
        np.testing.assert_array_equal(np.concatenate(got), samples)
        runs.append((sizes, samples, state.speech_tokens))
    # 25 prompt tokens: no padding; hop 25 (its look-ahead ends at 28), then the 5 left
    assert runs[0][0] == [25 * 960 - 3840, 5 * 960 + 3840]
    for sizes, samples, tokens in runs[1:]:
        assert sizes == runs[0][0] and tokens == 30
        np.testing.assert_array_equal(samples, runs[0][1])
    assert samples.size == 30 * 960


def test_streaming_refuses_a_speed_change(tiny_engine: Any) -> None:
    from shared.errors import InvalidRequestError  # noqa: PLC0415

    request = SynthesisInput(text="Hello.", prompt=quiet_prompt(), mode="cross_lingual", speed=1.5)
    with pytest.raises(InvalidRequestError, match=r"streaming needs speed 1\.0"):
        tiny_engine.run_streaming(request, lambda _chunk: None)
