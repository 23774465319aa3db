"""The int8 ORT batched decoder (`ort_batch`) against the int8 alone path, on a small model.

What is compared: each piece decoded alone on int8 (`iter_speech_tokens` over `OrtSpeechLM`)
against the same piece as a row of `OrtBatchDecoder`, joining and leaving beside others.
Where the math is the same (one row, or the prefill, which runs alone in its slot) the
log-probs match to float32 rounding; a step of n > 1 rows runs MatMulNBits on n rows at once,
whose blocked kernel may sum in another order than the one-row kernel, so log-probs are held
to 1e-4 nats and the sampled tokens (the same seed) to equality.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from shared.errors import InvalidRequestError
from tests.unit.model.llm_rows import PIECES, SPEECH, Piece, add, alone, drain, random_llm
from workers.model.llm.batch import RowTooLong
from workers.model.llm.ort_batch import OrtBatchDecoder, OrtRowCache
from workers.model.llm.ort_decoder import OrtSpeechLM, load_ort_llm
from workers.model.llm.qwen2 import KVCache

LOGP_ATOL = 1e-4  # nats: n-row against one-row MatMulNBits (0.0 measured on this model)


@pytest.fixture(scope="module")
def lm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OrtSpeechLM]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = random_llm(hidden=64, intermediate=96)
    cache_dir = tmp_path_factory.mktemp("onnx")
    yield load_ort_llm(model, cache_dir=cache_dir, checkpoint_hash="ab" * 32, threads=1)
    torch.set_num_threads(threads)


def test_a_batch_gives_every_piece_its_alone_int8_tokens(lm: OrtSpeechLM) -> None:
    expected = [alone(lm, piece) for piece in PIECES]
    lengths = {len(tokens) for tokens in expected}
    assert len(lengths) >= 4, f"rows should leave at different steps: {lengths}"
    decoder = OrtBatchDecoder(lm, rows=len(PIECES), positions=512)
    done = drain(decoder, [(0, i) for i in range(len(PIECES))])
    assert [done[i].tokens for i in range(len(PIECES))] == expected
    assert done[0].batch_size == len(PIECES) - 1  # the forced-0 row never took a step
    assert not decoder.rows and decoder.free == len(PIECES)


def test_rows_joining_and_leaving_mid_batch_reuse_slots(lm: OrtSpeechLM) -> None:
    expected = [alone(lm, piece) for piece in PIECES]
    decoder = OrtBatchDecoder(lm, rows=3, positions=512)
    joins = [(0, 0), (0, 1), (2, 2), (9, 3), (30, 4), (30, 5)]  # 3 rows: later ones wait
    done = drain(decoder, joins)
    assert [done[i].tokens for i in range(len(PIECES))] == expected
    assert max(row.batch_size for row in done.values()) == 3


def teacher_forced(lm: OrtSpeechLM, piece: Piece, tokens: list[int]) -> torch.Tensor:
    """The alone int8 path's log-probs (steps, V) along `tokens`: the prefill's, then one per
    token fed back."""
    prefix = lm.prefix_embeddings(
        torch.tensor(piece.text),
        torch.tensor(piece.prompt_text, dtype=torch.long),
        torch.tensor(piece.prompt_speech, dtype=torch.long),
    )
    cache = KVCache(lm.config.backbone, prefix.shape[1] + len(tokens) + 1)
    out = [lm.step_logp(prefix, cache)]
    for token in tokens:
        out.append(lm.step_logp(lm.speech_embedding.weight[token].view(1, 1, -1), cache))
    return torch.stack(out)


@torch.inference_mode()
def test_each_rows_log_probs_are_its_alone_int8_log_probs(lm: OrtSpeechLM) -> None:
    decoder = OrtBatchDecoder(lm, rows=4, positions=512)
    for index in (0, 1):
        add(decoder, index, PIECES[index])
    seen: dict[int, list[torch.Tensor]] = {i: [] for i in (0, 1, 2, 4)}
    finished: dict[int, list[int]] = {}
    step = 0
    while decoder.rows:
        if step == 3:  # two rows join a batch already decoding: ragged lengths
            add(decoder, 2, PIECES[2])
            add(decoder, 4, PIECES[4])
        for row in decoder.rows:
            seen[int(row.key)].append(row.logp.clone())  # type: ignore[call-overload]
        finished.update({int(r.key): r.tokens for r in decoder.step()})  # type: ignore[call-overload]
        step += 1
    for index, tokens in finished.items():
        got = torch.stack(seen[index])
        reference = teacher_forced(lm, PIECES[index], tokens)[: got.shape[0]]
        finite = torch.isfinite(got)  # masked stop ids are -inf before the minimum length
        assert torch.equal(finite, torch.isfinite(reference))
        difference = (got[finite] - reference[finite]).abs().max().item()
        assert difference <= LOGP_ATOL, (index, difference)
        assert torch.equal(got[0], reference[0]), index  # the prefill runs alone in its slot


def test_validation_and_row_bounds_match_the_torch_decoder(lm: OrtSpeechLM) -> None:
    decoder = OrtBatchDecoder(lm, rows=2, positions=40)
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(InvalidRequestError, match="text: needs at least one token"):
        decoder.add(0, [], prompt_text=[], prompt_speech=[], generator=generator)
    with pytest.raises(InvalidRequestError, match="prompt_speech: token ids must be in"):
        decoder.add(0, [1], prompt_text=[], prompt_speech=[SPEECH], generator=generator)
    with pytest.raises(RowTooLong):
        decoder.add(0, [1, 2], prompt_text=[], prompt_speech=[], generator=generator)
    decoder.add(0, [1], prompt_text=[], prompt_speech=[], generator=generator)  # 2+1+20 fits
    decoder.add(1, [1], prompt_text=[], prompt_speech=[], generator=generator)
    with pytest.raises(ValueError, match="no free row"):
        decoder.add(2, [1], prompt_text=[], prompt_speech=[], generator=generator)
    assert decoder.drop(0) and [row.key for row in decoder.rows] == [1]
    assert decoder.cache.lengths == [3, 0]  # row 1 (SOS, text, TASK) moved into slot 0
    decoder.clear()
    assert not decoder.rows and decoder.free == 2 and decoder.cache.lengths == [0, 0]


def test_the_cache_lives_in_numpy_buffers_ort_writes_in_place(lm: OrtSpeechLM) -> None:
    cache = OrtRowCache(lm, rows=3, positions=1000)
    backbone = lm.config.backbone
    assert cache.positions == 512  # capped at max_position_embeddings
    assert cache.keys[0].shape == (3, backbone.num_kv_heads, 512, backbone.head_dim)
    assert cache.nbytes() == 2 * 2 * 3 * 2 * 512 * 16 * 4
    assert not any(buffer.any() for buffer in (*cache.keys, *cache.values))
    row = cache.row(1)
    lm.step_logp(torch.ones(1, 5, backbone.hidden_size), row)
    assert row.length == 5
    written = [bool(np.abs(buffer[1, :, :5]).sum() > 0) for buffer in cache.keys]
    untouched = [not buffer[[0, 2]].any() and not buffer[1, :, 5:].any() for buffer in cache.keys]
    assert all(written) and all(untouched)
    assert cache.first(2).keys[0].base is cache.keys[0]  # a view, not a copy
    cache.lengths[1] = 5
    cache.move(1, 0)
    np.testing.assert_array_equal(cache.keys[0][0, :, :5], cache.keys[0][1, :, :5])
    assert cache.lengths[:2] == [5, 0]


def test_the_batched_rows_open_the_single_row_graph_file(lm: OrtSpeechLM) -> None:
    files = sorted(Path(lm.path).parent.iterdir())
    OrtBatchDecoder(lm, rows=2, positions=64)
    assert sorted(Path(lm.path).parent.iterdir()) == files == [lm.path]
