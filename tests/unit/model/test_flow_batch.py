"""The padded flow batch against the alone flow call (tiny model, fp32, CPU)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from shared.errors import InvalidRequestError
from workers.engine.pipeline import EngineOptions, build_engine
from workers.model.flow.batch import FlowRow, batched_inference
from workers.model.flow.model import CausalMaskedDiffWithXvec

TOLERANCE = 1e-4  # max abs on the mel; the waveform bound is checked in the engine tests
# Euler steps, not the tiny model's 10: a batched row against its alone call is compared step by
# step alike (the steps repeat one step's arithmetic); three, so that `between_steps` runs
# between steps more than once.
FLOW_STEPS = 3


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """One intra-op thread: shared, loaded cores make OpenMP's spinning threads very slow."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def flow(tiny_model_dir: Path) -> CausalMaskedDiffWithXvec:
    engine = build_engine(
        tiny_model_dir, device="cpu", options=EngineOptions(flow_steps=FLOW_STEPS)
    )
    model = engine.flow.model  # type: ignore[attr-defined]
    assert isinstance(model, CausalMaskedDiffWithXvec)
    assert model.config.cfm.n_timesteps == FLOW_STEPS
    return model


def make_row(flow: CausalMaskedDiffWithXvec, seed: int, tokens: int, prompt: int) -> FlowRow:
    g = torch.Generator().manual_seed(seed)
    vocab, ratio = flow.config.vocab_size, flow.config.token_mel_ratio
    return FlowRow(
        token=torch.randint(0, vocab, (1, tokens), generator=g, dtype=torch.int32),
        prompt_token=torch.randint(0, vocab, (1, prompt), generator=g, dtype=torch.int32),
        prompt_feat=torch.randn(1, ratio * prompt, flow.config.mel_bins, generator=g) - 5,
        embedding=torch.randn(1, flow.config.spk_embed_dim, generator=g),
    )


def alone(flow: CausalMaskedDiffWithXvec, row: FlowRow) -> torch.Tensor:
    mel, _ = flow.inference(row.token, row.prompt_token, row.prompt_feat, row.embedding)
    return mel[0]


def test_rows_of_mixed_lengths_and_prompts_match_alone(flow: CausalMaskedDiffWithXvec) -> None:
    rows = [
        make_row(flow, 1, tokens=40, prompt=25),
        make_row(flow, 2, tokens=7, prompt=0),
        make_row(flow, 3, tokens=23, prompt=60),
        make_row(flow, 4, tokens=1, prompt=3),
    ]
    batched = batched_inference(flow, rows)
    for row, mel in zip(rows, batched, strict=True):
        expected = alone(flow, row)
        assert mel.shape == expected.shape == (80, 2 * row.token.size(1))
        assert float((mel - expected).abs().max()) <= TOLERANCE


def test_one_row_is_the_alone_call(flow: CausalMaskedDiffWithXvec) -> None:
    row = make_row(flow, 5, tokens=30, prompt=10)
    assert float((batched_inference(flow, [row])[0] - alone(flow, row)).abs().max()) <= 1e-6


def test_a_bad_row_is_refused_before_any_compute(flow: CausalMaskedDiffWithXvec) -> None:
    good = make_row(flow, 6, tokens=5, prompt=5)
    bad = FlowRow(good.token, good.prompt_token, good.prompt_feat[:, :3], good.embedding)
    with pytest.raises(InvalidRequestError, match="flow prompt_feat"):
        batched_inference(flow, [good, bad])


def test_between_steps_runs_after_each_euler_step_but_the_last_and_changes_nothing(
    flow: CausalMaskedDiffWithXvec,
) -> None:
    rows = [make_row(flow, 7, tokens=12, prompt=6), make_row(flow, 8, tokens=9, prompt=4)]
    calls: list[int] = []

    def elsewhere() -> None:  # other work on the same thread, as a batch session's task is
        calls.append(len(calls))
        alone(flow, make_row(flow, 9, tokens=5, prompt=3))

    plain = batched_inference(flow, rows)
    with_calls = batched_inference(flow, rows, between_steps=elsewhere)
    assert len(calls) == flow.config.cfm.n_timesteps - 1
    for a, b in zip(plain, with_calls, strict=True):
        assert torch.equal(a, b)
