"""The agreement measures of `bench --compare-fp32` (teacher-forced, free-running, overlap)."""

from __future__ import annotations

import math

import pytest
import torch

from workers.model.llm.sampling import SamplingConfig, ras_sampling
from workers.tools.bench.llm_agreement import agreement_of, id_ordered_draw, nucleus, overlap


def test_free_running_agreement_counts_positions_and_finds_the_first_divergence() -> None:
    same = agreement_of([1, 2, 3, 4], [1, 2, 3, 4])
    assert (same.agreed, same.steps, same.first_divergence) == (4, 4, None)
    split = agreement_of([1, 2, 3, 4, 5], [1, 2, 9, 4, 7])
    assert (split.agreed, split.steps, split.first_divergence) == (3, 5, 2)
    assert "3 / 5 (60.0%), free-running; first divergence at step 2" in split.line()


def test_overlap_is_one_minus_total_variation() -> None:
    assert overlap({1: 0.5, 2: 0.5}, {1: 0.5, 2: 0.5}) == pytest.approx(1.0)
    assert overlap({1: 1.0}, {2: 1.0}) == 0.0
    assert overlap({1: 0.7, 2: 0.3}, {1: 0.4, 3: 0.6}) == pytest.approx(0.4)


def test_the_nucleus_is_what_the_sampler_draws_from() -> None:
    config = SamplingConfig(top_p=0.8, top_k=5)
    logp = torch.log_softmax(torch.tensor([3.0, 2.0, 1.0, 0.5, 0.0, -1.0, -5.0]), dim=0)
    support = nucleus(logp, config.top_p, config.top_k)
    assert math.fsum(support.values()) == pytest.approx(1.0)
    # the first ids while the sum before them is below top_p: 0 (0), 1 (0.60), 2 (0.83 >= 0.8)
    assert set(support) == {0, 1}
    generator = torch.Generator().manual_seed(0)
    drawn = {ras_sampling(logp, [], config, generator) for _ in range(200)}
    assert drawn == set(support)
    assert support[0] > support[1]


def test_an_id_ordered_draw_ignores_the_order_of_scores() -> None:
    p = {7: 0.25, 3: 0.5, 9: 0.25}  # ids ascending: 3 [0, .5), 7 [.5, .75), 9 [.75, 1)
    assert [id_ordered_draw(p, u) for u in (0.0, 0.49, 0.5, 0.74, 0.75, 0.999)] == [
        3,
        3,
        7,
        7,
        9,
        9,
    ]
    swapped = {7: 0.26, 3: 0.5, 9: 0.24}  # 7 and 9 swap places by score: most draws keep
    same = sum(id_ordered_draw(p, u / 100) == id_ordered_draw(swapped, u / 100) for u in range(100))
    assert same == 99  # only u in [0.75, 0.76) moves
