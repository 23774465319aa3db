"""The incremental streaming flow (`FlowStreamCache`) equals the whole-prefix recompute.

The reference set's tiny flow in float32, random tokens and prompts whose lengths are not
multiples of the 25-token chunk: hop by hop through the engine's `PieceStream` (several hops,
a partly full last chunk), and call by call against `inference(streaming=True)` over the tokens
given so far, with hops off the chunk edges too (partly full chunks computed again).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from shared.errors import InvalidRequestError
from tests.unit.model.flows import (  # noqa: F401 (fixtures used by name)
    reference_steps_flow_fixture,
    stream_test_flow,
)
from workers.engine.api import VoicePrompt
from workers.engine.flow_chunks import BoundedFlowChunks, CachedFlowChunks
from workers.engine.stages import ModuleFlow
from workers.engine.streaming import StreamSchedule
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.model.flow.stream import FlowStreamCache, keep_period
from workers.tools.reference.streaming import chunked_mels

TOLERANCE = 1e-5  # max abs, float32


def piece(prompt_tokens: int, tokens: int, seed: int) -> dict[str, np.ndarray]:
    """Random flow inputs shaped as the reference call's (batch 1)."""
    rng = np.random.default_rng(seed)
    return {
        "token": rng.integers(0, 6561, (1, tokens)).astype(np.int32),
        "prompt_token": rng.integers(0, 6561, (1, prompt_tokens)).astype(np.int32),
        "prompt_feat": rng.standard_normal((1, 2 * prompt_tokens, 80)).astype(np.float32),
        "embedding": rng.standard_normal((1, 192)).astype(np.float32),
    }


def test_keep_period_is_the_chunk_in_tokens(flow: CausalMaskedDiffWithXvec) -> None:
    assert keep_period(flow) == 25


@pytest.mark.parametrize(("prompt_tokens", "tokens"), [(13, 130), (7, 100), (31, 180)])
def test_hop_by_hop_equals_the_recompute(
    flow: CausalMaskedDiffWithXvec, prompt_tokens: int, tokens: int
) -> None:
    arrays = piece(prompt_tokens, tokens, seed=prompt_tokens)
    with torch.inference_mode():
        cached, hops = chunked_mels(flow, arrays, StreamSchedule())
        recomputed, same_hops = chunked_mels(flow, arrays, StreamSchedule(), cached=False)
    assert hops == same_hops and len(hops) >= 3  # several hops, then the final chunk
    assert (prompt_tokens + hops[0]) % 25 == 0 and hops[-1] % 25 != 0
    for mine, theirs in zip(cached, recomputed, strict=True):
        assert mine.shape == theirs.shape
        assert np.abs(mine - theirs).max() <= TOLERANCE
    inputs = [torch.from_numpy(arrays[k]) for k in ("token", "prompt_token")]
    with torch.inference_mode():
        whole, _ = flow.inference(
            *inputs,
            torch.from_numpy(arrays["prompt_feat"]),
            torch.from_numpy(arrays["embedding"]),
            streaming=True,
        )
    assert np.abs(np.concatenate(cached, axis=1) - whole[0].numpy()).max() <= TOLERANCE


@pytest.mark.parametrize("cuts", [[10, 23, 31, 60, 64], [40, 41, 90]])
def test_calls_off_the_chunk_edges_equal_inference_over_the_tokens_so_far(
    flow: CausalMaskedDiffWithXvec, cuts: list[int]
) -> None:
    """Each call's frames are what `inference(finalize=False)` gives them; a chunk left
    partly full is recomputed, so the cache keeps only positions before a chunk edge."""
    arrays = {k: torch.from_numpy(v) for k, v in piece(19, 100, seed=len(cuts)).items()}
    token, prompt = arrays["token"], (arrays["prompt_token"], arrays["prompt_feat"])
    emitted, start = 0, 0
    with torch.inference_mode():
        cache = FlowStreamCache(flow, *prompt, arrays["embedding"])
        for end in [*cuts, token.size(1)]:
            final = end == token.size(1)
            mel = cache.advance(token[:, start:end], finalize=final)
            expected, _ = flow.inference(
                token[:, :end], *prompt, arrays["embedding"], streaming=True, finalize=final
            )
            assert mel.shape[-1] == expected.shape[-1] - emitted
            assert (mel - expected[:, :, emitted:]).abs().max() <= TOLERANCE
            emitted, start = expected.shape[-1], end
            kept = cache.kept
            assert kept % 25 == 0 and (final or kept <= 19 + end - 3)
    assert cache.encoder.cache.nbytes > 0


def test_the_cache_holds_kept_positions_and_refuses_a_call_after_the_final_one(
    flow: CausalMaskedDiffWithXvec,
) -> None:
    arrays = {k: torch.from_numpy(v) for k, v in piece(13, 90, seed=3).items()}
    with torch.inference_mode():
        cache = FlowStreamCache(
            flow, arrays["prompt_token"], arrays["prompt_feat"], arrays["embedding"]
        )
        assert cache.advance(arrays["token"][:, :2], finalize=False).shape == (1, 80, 0)
        assert cache.advance(arrays["token"][:, 2:40], finalize=False).shape == (1, 80, 74)
        assert cache.kept == 50  # 13 + 37 tokens: the first chunk edge after the prompt
        layers = [kv.length for kv in cache.steps[0].cache._attention.values()]
        assert layers and all(length == 100 for length in layers)  # frames of 50 tokens
        cache.advance(arrays["token"][:, 40:], finalize=True)
        with pytest.raises(InvalidRequestError, match="after the final one"):
            cache.advance(arrays["token"][:, :1], finalize=True)


def test_a_cache_over_its_limit_hands_the_piece_to_the_recompute(
    flow: CausalMaskedDiffWithXvec,
) -> None:
    """COSYQ_STREAM_FLOW_CACHE_MAX_MB: past it a piece's later hops recompute the prefix; the
    mel stays what the cache would have made."""
    arrays = piece(13, 130, seed=3)
    tiny_limit = StreamSchedule(flow_cache_max_mb=0.01)  # 10 KiB: not even the first hop fits
    with torch.inference_mode():
        cached, hops = chunked_mels(flow, arrays, StreamSchedule())
        bounded, same_hops = chunked_mels(flow, arrays, tiny_limit)
    assert hops == same_hops
    for mine, theirs in zip(bounded, cached, strict=True):
        assert mine.shape == theirs.shape
        assert np.abs(mine - theirs).max() <= TOLERANCE
    prompt = prompt_of(arrays)
    chunks = ModuleFlow(flow).open_stream(prompt, cache_max_bytes=10 * 1024)
    assert isinstance(chunks, BoundedFlowChunks)
    with torch.inference_mode():
        chunks.mel(arrays["token"][0, :40], finalize=False)
    assert chunks.switched_at == 0 and chunks.cached is None
    assert chunks.peak_bytes <= 10 * 1024
    assert isinstance(ModuleFlow(flow).open_stream(prompt), CachedFlowChunks)


def prompt_of(arrays: dict[str, np.ndarray]) -> VoicePrompt:
    return VoicePrompt(
        speech_tokens=arrays["prompt_token"][0],
        mel=arrays["prompt_feat"][0],
        embedding=arrays["embedding"][0],
        transcript="",
    )


def test_the_cache_never_holds_more_than_its_limit(flow: CausalMaskedDiffWithXvec) -> None:
    """The limit is checked before a buffer grows: whatever the limit (between what the hops
    need, or just under a growth by half), the cache's peak stays within it, the hop that does
    not fit is recomputed, and the mel is the unbounded cache's."""
    arrays = piece(13, 200, seed=5)
    cuts = [37, 62, 87, 112, 137, 162]  # hops ending on chunk edges (13 + 37 = 50 tokens)
    with torch.inference_mode():
        free = ModuleFlow(flow).open_stream(prompt_of(arrays))
        assert isinstance(free, CachedFlowChunks)
        reference, sizes = [], []
        for start, end in zip([0, *cuts], [*cuts, 200], strict=True):
            reference.append(free.mel(arrays["token"][0, start:end], finalize=end == 200))
            sizes.append(free.cache.nbytes)
    assert sizes == sorted(sizes) and sizes[0] < sizes[-2]
    for limit in [sizes[0], (sizes[1] + sizes[2]) // 2, sizes[3] - 1]:
        with torch.inference_mode():
            bounded = ModuleFlow(flow).open_stream(prompt_of(arrays), cache_max_bytes=limit)
            assert isinstance(bounded, BoundedFlowChunks)
            for (start, end), expected in zip(
                zip([0, *cuts], [*cuts, 200], strict=True), reference, strict=True
            ):
                mel = bounded.mel(arrays["token"][0, start:end], finalize=end == 200)
                assert mel.shape == expected.shape
                assert np.abs(mel - expected).max() <= TOLERANCE
        assert 0 < bounded.peak_bytes <= limit
        assert bounded.switched_at is not None and bounded.switched_at >= cuts[0]


def _snr_db(mine: np.ndarray, reference: np.ndarray) -> float:
    return float(10 * np.log10((reference**2).sum() / ((mine - reference) ** 2).sum()))


def test_a_bf16_stream_matches_its_recompute(
    reference_steps_flow: CausalMaskedDiffWithXvec, bf16_attention_kernel: str
) -> None:
    """bf16 runs the host's CPU attention (blocked: the streamed passes' chunk mask as key
    limits; fused: the same limits as a dense mask): the hops' mel is as close to fp32's as
    the whole-prefix recompute's is, and close to that recompute (a chunk's queries seeing
    the wrong keys falls far below either)."""
    flow = reference_steps_flow
    arrays = piece(13, 130, seed=13)
    low = copy.deepcopy(flow).to(torch.bfloat16)
    with torch.inference_mode():
        full, _ = chunked_mels(flow, arrays, StreamSchedule())
        cached, _ = chunked_mels(low, arrays, StreamSchedule())
        recomputed, _ = chunked_mels(low, arrays, StreamSchedule(), cached=False)
    full_mel, cached_mel, recomputed_mel = (
        np.concatenate(mels, axis=1) for mels in (full, cached, recomputed)
    )
    assert _snr_db(cached_mel, recomputed_mel) >= 35
    assert _snr_db(cached_mel, full_mel) >= _snr_db(recomputed_mel, full_mel) - 1
