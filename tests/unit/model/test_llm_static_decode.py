"""The static-KV-cache decode step (the CUDA path, run eagerly here): the same log-probs and
tokens as the dynamic batched step, padded buckets, graph keys."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from workers.model.llm.batch import BatchDecoder
from workers.model.llm.model import Qwen2LM
from workers.model.llm.sampling import SamplingConfig
from workers.model.llm.static_decode import (
    BATCH_BUCKETS,
    GraphKey,
    StaticDecoder,
    bucket_for,
    buckets_for,
)

from .llm_rows import PIECES, add, alone, drain, random_llm


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> Qwen2LM:
    """test_llm_batch's model: rows end at different steps."""
    return random_llm(hidden=32, intermediate=48)


def test_buckets_round_up_and_end_at_the_cache_rows() -> None:
    assert buckets_for(16) == (1, 2, 4, 8, 16)
    assert buckets_for(6) == (1, 2, 4, 6)
    assert buckets_for(100) == (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 100)
    assert buckets_for(128) == BATCH_BUCKETS
    assert [bucket_for(n, buckets_for(64)) for n in (1, 3, 5, 9, 17, 25, 33, 49, 64)] == [
        1,
        4,
        8,
        16,
        24,
        32,
        48,
        64,
        64,
    ]
    with pytest.raises(ValueError, match="exceed the largest bucket 8"):
        bucket_for(9, buckets_for(8))
    with pytest.raises(ValueError, match="rows >= 1"):
        buckets_for(0)


def test_a_graph_key_names_device_dtype_bucket_and_positions(model: Qwen2LM) -> None:
    decoder = BatchDecoder(model, rows=8, positions=256, static=True)
    static = decoder.static
    assert static is not None
    assert static.key(4) == GraphKey("cpu", "float32", 4, 256)
    assert static.key(4).name == "cpu/float32/b4/p256"
    assert static.capture() == ()  # no graphs off CUDA: nothing captured, nothing run


def test_graphs_need_a_cuda_cache(model: Qwen2LM) -> None:
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA cache"):
        BatchDecoder(model, rows=2, positions=64, graphs=True)


def test_static_steps_give_the_dynamic_steps_log_probs_in_padded_buckets(model: Qwen2LM) -> None:
    """Rows of different lengths, joining and leaving (buckets 4 and 8 with padding rows):
    every step's log-probs within float rounding of the dynamic path's, the same tokens."""
    dynamic = BatchDecoder(model, rows=8, positions=512)
    static = BatchDecoder(model, rows=8, positions=512, static=True)
    for decoder in (dynamic, static):
        for index in range(5):  # 5 rows: bucket 8, 3 padding rows
            add(decoder, index, PIECES[index])
    steps = 0
    worst = 0.0
    while dynamic.rows:
        assert [r.key for r in dynamic.rows] == [r.key for r in static.rows]
        for a, b in zip(dynamic.rows, static.rows, strict=True):
            finite = torch.isfinite(a.logp)
            assert torch.equal(finite, torch.isfinite(b.logp))
            worst = max(worst, float((a.logp[finite] - b.logp[finite]).abs().max()))
        finished = (dynamic.step(), static.step())
        assert [f.tokens for f in finished[0]] == [f.tokens for f in finished[1]]
        steps += 1
    assert not static.rows and steps > 5
    assert worst < 1e-4, worst


def test_a_static_batch_gives_every_piece_its_alone_tokens(model: Qwen2LM) -> None:
    expected = [alone(model, piece) for piece in PIECES]
    decoder = BatchDecoder(model, rows=3, positions=512, static=True)
    done = drain(decoder, [(0, 0), (0, 1), (2, 2), (9, 3), (30, 4), (30, 5)])
    assert [done[i].tokens for i in range(len(PIECES))] == expected


def test_a_compiled_step_function_is_what_runs(model: Qwen2LM) -> None:
    """`step_fn` (where a `torch.compile`d step goes) replaces the eager step."""
    calls: list[int] = []

    def counting(*args: torch.Tensor | Qwen2LM) -> torch.Tensor:
        from workers.model.llm.static_decode import decode_step  # noqa: PLC0415

        calls.append(int(args[3].shape[0]))  # type: ignore[union-attr]
        return decode_step(*args)  # type: ignore[arg-type]

    decoder = BatchDecoder(
        model, rows=4, positions=256, static=True, step_fn=counting, sampling=SamplingConfig()
    )
    add(decoder, 0, PIECES[0])
    add(decoder, 1, PIECES[1])
    add(decoder, 2, PIECES[2])
    decoder.step()
    assert calls == [4]  # 3 rows ran in bucket 4
    assert isinstance(decoder.static, StaticDecoder)
