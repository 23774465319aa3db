"""A voice's primed flow prefix (`FlowStreamCache.prime` / `fork`, `VoicePrefixes`) changes no mel.

The reference set's tiny flow in float32 with random prompts long enough to have a voice-only
prefix (a chunk edge at or before P - 3 tokens): a piece that starts from the voice's primed
stream, on the voice's first piece (it primes) and on later ones (they fork), gives the mel of
a piece that computes everything itself; forks of one prefix do not disturb each other or the
stored prefix; the store is bounded in bytes, least recently used voice out first.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from tests.unit.model.flows import (  # noqa: F401 (fixtures used by name)
    reference_steps_flow_fixture,
    stream_test_flow,
)
from workers.engine.api import VoicePrompt
from workers.engine.flow_chunks import BoundedFlowChunks, CachedFlowChunks
from workers.engine.stages import ModuleFlow
from workers.engine.voice_prefixes import VoicePrefixes, voice_key
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.model.flow.stream import FlowStreamCache

TOLERANCE = 1e-5  # max abs, float32
CUTS = [22, 47, 97]  # hop ends (tokens) before the final call


def voice(prompt_tokens: int, seed: int) -> VoicePrompt:
    rng = np.random.default_rng(seed)
    return VoicePrompt(
        speech_tokens=rng.integers(0, 6561, prompt_tokens).astype(np.int32),
        mel=rng.standard_normal((2 * prompt_tokens, 80)).astype(np.float32),
        embedding=rng.standard_normal(192).astype(np.float32),
        transcript="",
    )


def tokens(count: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 6561, count).astype(np.int32)


def mels(chunks: CachedFlowChunks | BoundedFlowChunks, ids: np.ndarray) -> list[np.ndarray]:
    """The piece's mel call by call: hops ending at CUTS, then the final call."""
    ends = [*CUTS, ids.size]
    with torch.inference_mode():
        return [
            chunks.mel(ids[start:end], finalize=end == ids.size)
            for start, end in zip([0, *CUTS], ends, strict=True)
        ]


def assert_same(mine: list[np.ndarray], theirs: list[np.ndarray]) -> None:
    assert [m.shape for m in mine] == [t.shape for t in theirs]
    for a, b in zip(mine, theirs, strict=True):
        assert np.abs(a - b).max() <= TOLERANCE


def plain(flow: CausalMaskedDiffWithXvec, prompt: VoicePrompt, ids: np.ndarray) -> list[np.ndarray]:
    chunks = ModuleFlow(flow).open_stream(prompt)
    assert isinstance(chunks, CachedFlowChunks) and chunks.prefix_use is None
    return mels(chunks, ids)


@pytest.mark.parametrize(("prompt_tokens", "edge"), [(31, 25), (53, 50), (77, 50)])
def test_first_and_later_pieces_of_a_voice_give_the_mel_of_a_piece_alone(
    flow: CausalMaskedDiffWithXvec, prompt_tokens: int, edge: int
) -> None:
    prompt = voice(prompt_tokens, seed=prompt_tokens)
    store = VoicePrefixes(64 * 2**20)
    stages = ModuleFlow(flow, voice_prefixes=store)
    for piece, hit in [(1, False), (2, True), (3, True)]:
        ids = tokens(130, seed=piece)
        chunks = stages.open_stream(prompt)
        assert isinstance(chunks, CachedFlowChunks)
        use = chunks.prefix_use
        assert use is not None and use.hit is hit and use.prefix_tokens == edge
        assert (use.prime_s > 0) is not hit and use.prefix_bytes > 0
        assert chunks.cache.kept == edge  # the piece's first pass starts at the voice's edge
        assert_same(mels(chunks, ids), plain(flow, prompt, ids))
    assert (store.hits, store.misses, len(store)) == (2, 1, 1)


def test_a_prompt_without_a_voice_only_chunk_is_not_kept(flow: CausalMaskedDiffWithXvec) -> None:
    prompt = voice(27, seed=1)  # 27 - 3 look-ahead tokens: no full chunk of the voice alone
    store = VoicePrefixes(64 * 2**20)
    chunks = ModuleFlow(flow, voice_prefixes=store).open_stream(prompt)
    assert isinstance(chunks, CachedFlowChunks) and chunks.prefix_use is not None
    assert chunks.prefix_use.prefix_tokens == 0 and len(store) == 0
    ids = tokens(130, seed=2)
    assert_same(mels(chunks, ids), plain(flow, prompt, ids))


def test_forks_of_one_prefix_run_interleaved_without_touching_it(
    flow: CausalMaskedDiffWithXvec,
) -> None:
    prompt = voice(60, seed=7)
    arrays = [torch.from_numpy(a)[None] for a in (prompt.speech_tokens, prompt.mel)]
    with torch.inference_mode():
        primed = FlowStreamCache(flow, *arrays, torch.from_numpy(prompt.embedding)[None])
        assert primed.prime() == 50
        held = primed.nbytes
        snapshot = [kv.keys.clone() for kv in primed.steps[0].cache._attention.values()]
        first, second = primed.fork(), primed.fork()
        layer, kept_by_primed = next(iter(primed.steps[0].cache._attention.items()))
        shared_keys = first.steps[0].cache._attention[layer].shared[0][0]
        assert shared_keys.data_ptr() == kept_by_primed.keys.data_ptr()  # read, not copied
        assert first.nbytes < held  # its own conv tails only, before its first pass
        one, two = torch.from_numpy(tokens(100, 1))[None], torch.from_numpy(tokens(100, 2))[None]
        out_one = [first.advance(one[:, :40], finalize=False)]
        out_two = [second.advance(two[:, :40], finalize=False)]
        out_one.append(first.advance(one[:, 40:], finalize=True))
        out_two.append(second.advance(two[:, 40:], finalize=True))
    assert primed.nbytes == held and primed.kept == 50
    kept = [kv.keys for kv in primed.steps[0].cache._attention.values()]
    assert all(torch.equal(a, b) for a, b in zip(snapshot, kept, strict=True))
    for ids, out in [(one, out_one), (two, out_two)]:
        with torch.inference_mode():  # the same calls on a stream that computes everything
            alone = FlowStreamCache(flow, *arrays, torch.from_numpy(prompt.embedding)[None])
            expected = [alone.advance(ids[:, :40], finalize=False)]
            expected.append(alone.advance(ids[:, 40:], finalize=True))
        assert_same([o[0].numpy() for o in out], [e[0].numpy() for e in expected])


def test_the_store_keeps_its_byte_limit_least_recently_used_voice_out_first(
    flow: CausalMaskedDiffWithXvec,
) -> None:
    voices = [voice(53, seed=s) for s in (1, 2, 3)]
    probe = VoicePrefixes(2**30)
    ModuleFlow(flow, voice_prefixes=probe).open_stream(voices[0])
    one_voice = probe.held_bytes
    store = VoicePrefixes(2 * one_voice)  # room for two voices of this length
    stages = ModuleFlow(flow, voice_prefixes=store)
    for prompt in [voices[0], voices[1], voices[0], voices[2]]:  # voice 1 is the oldest use
        stages.open_stream(prompt)
    assert store.held_bytes <= 2 * one_voice and len(store) == 2
    kept = set(store._primed)
    assert kept == {voice_key(voices[0]), voice_key(voices[2])}
    too_small = VoicePrefixes(one_voice - 1)  # a voice bigger than the store: not kept
    chunks = ModuleFlow(flow, voice_prefixes=too_small).open_stream(voices[1])
    assert isinstance(chunks, CachedFlowChunks) and len(too_small) == 0
    ids = tokens(130, seed=9)
    assert_same(mels(chunks, ids), plain(flow, voices[1], ids))


def test_a_fork_over_its_piece_limit_hands_the_piece_to_the_recompute(
    flow: CausalMaskedDiffWithXvec,
) -> None:
    prompt = voice(53, seed=4)
    store = VoicePrefixes(64 * 2**20)
    stages = ModuleFlow(flow, voice_prefixes=store)
    stages.open_stream(prompt)  # primes the voice
    chunks = stages.open_stream(prompt, cache_max_bytes=store.held_bytes // 2)
    assert isinstance(chunks, BoundedFlowChunks) and chunks.prefix_use is not None
    assert chunks.prefix_use.hit
    ids = tokens(130, seed=5)
    mine = mels(chunks, ids)
    assert chunks.switched_at == 0  # fp32 copies the prefix at its first pass: no room
    assert_same(mine, plain(flow, prompt, ids))


def test_a_bf16_fork_reads_the_prefix_in_place_and_holds_only_its_own_positions(
    reference_steps_flow: CausalMaskedDiffWithXvec, bf16_attention_kernel: str
) -> None:
    """bf16 reads a primed voice's keys/values where they are (blocked attention: per
    segment; fused: joined per call): a fork's cache holds only what it adds, and its mel is
    the one an unprimed bf16 stream gives, to bf16 rounding."""
    flow = reference_steps_flow
    low = copy.deepcopy(flow).to(torch.bfloat16)
    prompt = voice(60, seed=7)
    arrays = [torch.from_numpy(a)[None] for a in (prompt.speech_tokens, prompt.mel)]
    embedding = torch.from_numpy(prompt.embedding)[None]
    ids = torch.from_numpy(tokens(100, 3))[None]

    def run(stream: FlowStreamCache) -> np.ndarray:
        mel = [stream.advance(ids[:, :40], finalize=False)]
        mel.append(stream.advance(ids[:, 40:], finalize=True))
        return torch.cat(mel, dim=2)[0].float().numpy()

    with torch.inference_mode():
        primed = FlowStreamCache(low, *arrays, embedding)
        assert primed.prime() == 50
        fork = primed.fork()
        forked = run(fork)
        alone = FlowStreamCache(low, *arrays, embedding)
        unprimed = run(alone)
        full = run(FlowStreamCache(flow, *arrays, embedding))
    layer, kept_by_primed = next(iter(primed.steps[0].cache._attention.items()))
    shared_keys = fork.steps[0].cache._attention[layer].shared[0][0]
    assert shared_keys.data_ptr() == kept_by_primed.keys.data_ptr()
    assert fork.budget.peak <= alone.budget.peak - primed.nbytes + primed.nbytes // 10
    error = forked - unprimed
    assert 10 * np.log10((unprimed**2).sum() / (error**2).sum()) >= 35
    own_error, alone_error = forked - full, unprimed - full
    assert (own_error**2).sum() <= 1.3 * (alone_error**2).sum()
