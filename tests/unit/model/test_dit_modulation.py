"""The DiT's adaLN modulations kept per distinct t (`dit/modulation.py`)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import Tensor, nn

from workers.model.dit.config import DiTConfig
from workers.model.dit.estimator import DiT
from workers.model.dit.modulation import ModulationMemo

SMALL = DiTConfig(dim=64, depth=2, heads=2, dim_head=32)


class _Spy:
    """A modulation computation over a Linear: records each call's t values."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.layer = nn.Linear(1, 8).requires_grad_(False)
        self.calls: list[list[float]] = []

    def __call__(self, t: Tensor) -> list[Tensor]:
        self.calls.append(t.tolist())
        return [self.layer(t.unsqueeze(1)), 2 * self.layer(t.unsqueeze(1))]

    def lookup(self, memo: ModulationMemo, values: list[float]) -> list[Tensor]:
        return memo.lookup(torch.tensor(values), list(self.layer.parameters()), self)


def test_a_kept_t_is_not_computed_again_and_reads_back_the_same() -> None:
    spy, memo = _Spy(), ModulationMemo(limit=4)
    first = spy.lookup(memo, [0.5, 0.5])
    again = spy.lookup(memo, [0.5, 0.5, 0.5])
    assert spy.calls == [[0.5, 0.5]]  # the first call as upstream: every row
    assert all(a.shape == (3, 8) and torch.equal(a, f[:1].expand(3, -1))
               for a, f in zip(again, first, strict=True))  # fmt: skip
    mixed = spy.lookup(memo, [0.5, 0.25])
    assert spy.calls[-1] == [0.5, 0.25]  # 0.25 was new: the whole call computed
    assert torch.equal(spy.lookup(memo, [0.25, 0.5])[0], mixed[0].flip(0))
    assert len(spy.calls) == 2 and len(memo) == 2


def test_the_limit_starts_the_memo_over_and_zero_keeps_nothing() -> None:
    spy, memo = _Spy(), ModulationMemo(limit=2)
    for value in (0.1, 0.2, 0.3):
        spy.lookup(memo, [value])
    assert len(memo) == 1  # 0.3 did not fit beside 0.1 and 0.2: started over
    spy.lookup(memo, [0.3])
    assert len(spy.calls) == 3
    none = ModulationMemo(limit=0)
    spy.lookup(none, [0.3])
    spy.lookup(none, [0.3])
    assert len(spy.calls) == 5 and len(none) == 0
    with pytest.raises(ValueError, match="time_cache_values"):
        ModulationMemo(limit=-1)


def test_changed_or_replaced_weights_are_never_read_from_the_memo() -> None:
    spy, memo = _Spy(), ModulationMemo(limit=4)
    before = spy.lookup(memo, [0.5])[0]
    spy.layer.weight.mul_(2)  # in place: its version moves
    doubled = spy.lookup(memo, [0.5])[0]
    assert len(spy.calls) == 2 and not torch.equal(before, doubled)
    spy.layer.weight = nn.Parameter(spy.layer.weight * 0, requires_grad=False)  # replaced
    assert torch.equal(spy.lookup(memo, [0.5])[0], spy.layer.bias.view(1, -1))
    assert len(spy.calls) == 3


def _inputs(frames: int = 12) -> tuple[Tensor, ...]:
    g = torch.Generator().manual_seed(2)
    x, mu, cond = (torch.randn(2, 80, frames, generator=g) for _ in range(3))
    return x, torch.ones(2, 1, frames), mu, torch.full((2,), 0.3), torch.randn(2, 80), cond


def test_the_estimator_gives_the_same_velocity_from_the_memo() -> None:
    torch.manual_seed(0)
    kept = DiT(SMALL).eval().requires_grad_(False)
    for param in kept.parameters():
        param.normal_(0.0, 0.1)
    plain = DiT(dataclasses.replace(SMALL, time_cache_values=0)).eval().requires_grad_(False)
    plain.load_state_dict(kept.state_dict())
    inputs = _inputs()
    with torch.inference_mode():
        want = plain(*inputs)
        assert torch.equal(kept(*inputs), want) and len(kept.modulation_memo) == 1
        assert torch.equal(kept(*inputs), want)  # read back
        kept.bfloat16()  # converted: started over
        assert len(kept.modulation_memo) == 0
        kept(*(t.bfloat16() for t in inputs))
        assert len(kept.modulation_memo) == 1
        kept.load_state_dict(plain.bfloat16().state_dict())
        assert len(kept.modulation_memo) == 0


def test_rows_of_one_t_share_one_modulation_row_and_match_upstreams_ops() -> None:
    """On CPU inference, rows of one t get one (1, ...) modulation row (LayerNorm's own
    affine); the upstream ops (autograd on: no CPU shortcut) agree within fp32 rounding, and
    rows of different t still give each row what it gives alone."""
    torch.manual_seed(0)
    estimator = DiT(SMALL).eval()
    with torch.no_grad():
        for param in estimator.parameters():
            param.normal_(0.0, 0.1)
    x, mask, mu, t, spks, cond = _inputs()
    upstream = estimator(x, mask, mu, t, spks, cond).detach()  # grad on: the plain ops
    estimator.requires_grad_(False)
    with torch.inference_mode():
        assert all(m.size(0) == 1 for m in estimator.modulations(t))
        torch.testing.assert_close(estimator(x, mask, mu, t, spks, cond), upstream)
        two_t = torch.tensor([0.3, 0.7])
        assert all(m.size(0) == 2 for m in estimator.modulations(two_t))
        both = estimator(x, mask, mu, two_t, spks, cond)
        second = estimator(x[1:], mask[1:], mu[1:], two_t[1:], spks[1:], cond[1:])
    torch.testing.assert_close(both[1:], second)
