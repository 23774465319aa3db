"""The static decode on a CUDA card: captured graphs replay the eager step, and both give the
dynamic step's tokens. Skipped without CUDA (the GPU check runs it: `scripts/gpu-check`)."""

from __future__ import annotations

import pytest
import torch

from workers.model.llm.batch import BatchDecoder
from workers.model.llm.model import Qwen2LM
from workers.model.llm.static_decode import buckets_for

from .llm_rows import PIECES, add, drain, random_llm

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (run by scripts/gpu-check)"
)


@pytest.fixture(scope="module")
def model() -> Qwen2LM:
    return random_llm(hidden=32, intermediate=48).to("cuda")


def _tokens(decoder: BatchDecoder) -> list[list[int]]:
    done = drain(decoder, [(0, 0), (0, 1), (2, 2), (9, 3), (30, 4), (30, 5)])
    return [done[i].tokens for i in range(len(PIECES))]


def test_graphs_are_captured_per_bucket_and_replay_the_eager_step(model: Qwen2LM) -> None:
    graphs = BatchDecoder(model, rows=6, positions=512, graphs=True)
    assert graphs.static is not None
    keys = graphs.static.capture()
    assert [key.bucket for key in keys] == list(buckets_for(6))
    assert {key.device for key in keys} == {"cuda:0"}
    eager = BatchDecoder(model, rows=6, positions=512, static=True)
    for decoder in (graphs, eager):
        for index in range(3):
            add(decoder, index, PIECES[index])
    for _ in range(5):
        for a, b in zip(graphs.rows, eager.rows, strict=True):
            assert torch.equal(a.logp.cpu(), b.logp.cpu())  # the same kernels, replayed
        graphs.step()
        eager.step()


def test_graph_decoding_gives_the_dynamic_steps_tokens(model: Qwen2LM) -> None:
    dynamic = _tokens(BatchDecoder(model, rows=3, positions=512))
    assert _tokens(BatchDecoder(model, rows=3, positions=512, graphs=True)) == dynamic


def test_a_bf16_graph_step_is_within_rounding_of_the_dynamic_one(model: Qwen2LM) -> None:
    """One step from the same prefill (so the same first tokens): SDPA over the static cache
    and the dynamic step's matmuls differ by bf16 rounding only."""
    lm = model.to(torch.bfloat16)
    try:
        decoders = [
            BatchDecoder(lm, rows=4, positions=512),
            BatchDecoder(lm, rows=4, positions=512, graphs=True),
        ]
        for decoder in decoders:
            for index in range(3):
                add(decoder, index, PIECES[index])
            decoder.step()
        worst = 0.0
        for a, b in zip(decoders[0].rows, decoders[1].rows, strict=True):
            assert a.tokens == b.tokens
            finite = torch.isfinite(a.logp.cpu())
            diff = (a.logp.cpu()[finite] - b.logp.cpu()[finite]).abs().max()
            worst = max(worst, float(diff))
        assert worst < 0.25, worst
    finally:
        model.to(torch.float32)
