"""The batched LLM decoder against the alone path: same tokens, logits within 1e-5, joins."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from shared.errors import InvalidRequestError
from tests.unit.model.llm_rows import PIECES, SPEECH, add, alone, drain, random_llm
from workers.model.llm.batch import BatchDecoder, BatchKVCache, RowTooLong
from workers.model.llm.model import Qwen2LM


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: on shared, loaded cores OpenMP's spinning threads made these
    (many small ops) ~40x slower; the arithmetic compared is the same either way."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> Qwen2LM:
    return random_llm(hidden=32, intermediate=48)


def test_a_batch_gives_every_piece_its_alone_tokens(model: Qwen2LM) -> None:
    expected = [alone(model, piece) for piece in PIECES]
    lengths = {len(tokens) for tokens in expected}
    assert len(lengths) >= 4, f"rows should leave at different steps: {lengths}"
    decoder = BatchDecoder(model, rows=len(PIECES), positions=512)
    done = drain(decoder, [(0, i) for i in range(len(PIECES))])
    assert [done[i].tokens for i in range(len(PIECES))] == expected
    assert done[0].batch_size == len(PIECES) - 1  # the forced-0 row never took a step
    assert not decoder.rows and decoder.free == len(PIECES)


def test_rows_joining_between_steps_and_reusing_slots(model: Qwen2LM) -> None:
    expected = [alone(model, piece) for piece in PIECES]
    decoder = BatchDecoder(model, rows=3, positions=512)
    joins = [(0, 0), (0, 1), (2, 2), (9, 3), (30, 4), (30, 5)]  # 3 rows: later ones wait
    done = drain(decoder, joins)
    assert [done[i].tokens for i in range(len(PIECES))] == expected
    assert max(row.batch_size for row in done.values()) <= 3


def test_batched_logits_agree_with_a_teacher_forced_pass(model: Qwen2LM) -> None:
    """Each row's log-probs at every step equal the alone model's for the same history."""
    decoder = BatchDecoder(model, rows=4, positions=512)
    for index in range(4):
        add(decoder, index, PIECES[index])
    seen: dict[int, list[torch.Tensor]] = {i: [] for i in range(4)}
    while decoder.rows:
        for row in decoder.rows:
            seen[int(row.key)].append(row.logp.clone())  # type: ignore[call-overload]
        decoder.step()
    for index in range(4):
        piece = PIECES[index]
        tokens = alone(model, piece)
        _, _, logits = model.teacher_forced(
            torch.tensor(piece.text),
            torch.tensor(piece.prompt_text, dtype=torch.long),
            torch.tensor(piece.prompt_speech, dtype=torch.long),
            torch.tensor(tokens, dtype=torch.long),
        )
        prefix = 2 + len(piece.text) + len(piece.prompt_text) + len(piece.prompt_speech)
        reference = logits[0, prefix - 1 :].float().log_softmax(-1)
        got = torch.stack(seen[index])
        finite = torch.isfinite(got)  # masked stop ids are -inf before the minimum length
        # one sampling per token, plus the one that drew the stop id unless it hit its bound
        bound = 20 * len(piece.text) if piece.forced is None else piece.forced
        assert got.shape[0] == len(tokens) + (len(tokens) < bound)
        assert torch.allclose(got[finite], reference[: got.shape[0]][finite], atol=1e-5, rtol=0)


def test_validation_matches_the_alone_path(model: Qwen2LM) -> None:
    decoder = BatchDecoder(model, rows=2, positions=512)
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(InvalidRequestError, match="text: needs at least one token"):
        decoder.add(0, [], prompt_text=[], prompt_speech=[], generator=generator)
    with pytest.raises(InvalidRequestError, match="prompt_speech: token ids must be in"):
        decoder.add(0, [1], prompt_text=[], prompt_speech=[SPEECH], generator=generator)
    with pytest.raises(InvalidRequestError, match="max_position_embeddings"):
        decoder.add(0, [1] * 30, prompt_text=[], prompt_speech=[], generator=generator)
    assert not decoder.rows


def test_a_piece_longer_than_a_row_is_refused_for_running_alone(model: Qwen2LM) -> None:
    decoder = BatchDecoder(model, rows=2, positions=40)
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(RowTooLong):
        decoder.add(0, [1, 2], prompt_text=[], prompt_speech=[], generator=generator)
    decoder.add(0, [1], prompt_text=[], prompt_speech=[], generator=generator)  # 2+1+20 fits
    decoder.add(1, [1], prompt_text=[], prompt_speech=[], generator=generator)
    with pytest.raises(ValueError, match="no free row"):
        decoder.add(2, [1], prompt_text=[], prompt_speech=[], generator=generator)


def test_cache_is_zeroed_and_sized_from_its_arguments(model: Qwen2LM) -> None:
    cache = BatchKVCache(model.config.backbone, rows=3, positions=100)
    assert cache.keys.shape == (2, 3, 2, 100, 8)
    assert not cache.keys.any() and not cache.values.any()
    assert cache.nbytes() == 2 * 2 * 3 * 2 * 100 * 8 * 4
    capped = BatchKVCache(model.config.backbone, rows=1, positions=10_000)
    assert capped.positions == 512
