"""Parity of CosyVoice 3's DiT flow with the official arrays, and proof the checks can fail."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workers.model.dit.estimator import apply_rotary, rotary_inv_freq
from workers.model.dit.model import CausalMaskedDiffWithDiT
from workers.tools.reference.configs import dit_flow_config_from_reference
from workers.tools.reference.dit_flow import (
    compare_dit_flow,
    dit_flow_key_differences,
    load_reference_dit_flow,
)
from workers.tools.reference.parity import ArrayCheck, ReferenceSet

INPUTS = {"token", "prompt_token", "prompt_feat", "embedding", "n_timesteps", "inference_cfg_rate"}
EXPANDED = {"est_out": [f"est_out[{k}]" for k in range(10)]}


@pytest.fixture(scope="module")
def ref(reference3_dir: Path) -> ReferenceSet:
    return ReferenceSet(reference3_dir)


@pytest.fixture(scope="module")
def flow(ref: ReferenceSet) -> CausalMaskedDiffWithDiT:
    return load_reference_dit_flow(ref)


@pytest.fixture(scope="module")
def checks(ref: ReferenceSet, flow: CausalMaskedDiffWithDiT) -> list[ArrayCheck]:
    return compare_dit_flow(flow, ref)


def _failed(checks: list[ArrayCheck]) -> set[str]:
    return {c.name for c in checks if not c.passed}


def test_every_flow_array_of_the_cosyvoice3_set_is_checked_and_passes(
    ref: ReferenceSet, checks: list[ArrayCheck]
) -> None:
    stored = [name for name in ref.arrays("flow_reference.npz") if name not in INPUTS]
    expected = {f"flow_reference:{e}" for name in stored for e in EXPANDED.get(name, [name])}
    assert {c.name for c in checks} == expected | {"cfm_rand_noise:rand_noise"}
    assert _failed(checks) == set(), [c for c in checks if not c.passed]


def test_tolerances_are_the_readme_ones_or_tighter(checks: list[ArrayCheck]) -> None:
    by_name = {c.name: c for c in checks}
    for name in ("mel_nonstream", "mel_stream_finalize", "mel_stream_nofinalize"):
        assert by_name[f"flow_reference:{name}"].tolerance <= 1e-3
    mels = {"flow_reference:mel_nonstream", "flow_reference:mel_stream_finalize"}
    mels.add("flow_reference:mel_stream_nofinalize")
    assert all(c.tolerance <= 1e-4 for c in checks if c.name not in mels)


@pytest.mark.parametrize(
    ("size", "listing"), [("tiny", "keys-flow-tiny.txt"), ("full", "keys-flow.txt")]
)
def test_keys_equal_the_listings(ref: ReferenceSet, size: str, listing: str) -> None:
    config = dit_flow_config_from_reference(ref.config, size)
    assert dit_flow_key_differences(config, ref.root / listing) == []


def test_stored_inv_freq_is_the_recomputed_one(flow: CausalMaskedDiffWithDiT) -> None:
    estimator = flow.decoder.estimator
    assert torch.equal(estimator.rotary_embed.inv_freq, rotary_inv_freq(estimator.config))


def test_rotary_turns_only_the_first_head() -> None:
    x = torch.randn(1, 5, 8)
    angles = torch.full((5, 4), 0.3)
    out = apply_rotary(x, angles)
    assert torch.equal(out[..., 4:], x[..., 4:])
    assert not torch.allclose(out[..., :4], x[..., :4])


def test_perturbed_second_block_fails_from_that_block_on(ref: ReferenceSet) -> None:
    fresh = load_reference_dit_flow(ref)
    with torch.no_grad():
        fresh.decoder.estimator.transformer_blocks[1].attn.to_q.bias[3] += 0.5
    failed = _failed(compare_dit_flow(fresh, ref))
    assert {"flow_reference:dit_step0_block1_out", "flow_reference:est_out[0]"} <= failed
    assert "flow_reference:dit_step0_block0_out" not in failed
    assert "flow_reference:prelookahead_out" not in failed
