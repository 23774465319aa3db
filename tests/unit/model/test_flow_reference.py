"""Parity of our flow stage with the official reference arrays, and proof the checks can fail."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from workers.model.flow.config import FlowConfig
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.tools.reference.configs import flow_config_from_reference
from workers.tools.reference.flow import (
    check_flow,
    check_flow_full_keys,
    compare_flow,
    flow_key_differences,
    load_reference_flow,
)
from workers.tools.reference.parity import ArrayCheck, ReferenceSet

EXPECTED_ARRAYS = [
    "spk_proj",
    "encoder_out",
    "mu",
    "noise_z",
    "est_mask",
    "est_mu",
    "est_spks",
    "est_cond",
    "est_x",
    "est_t",
    *[f"est_out[{k}]" for k in range(10)],
    "mel_nonstream",
    "mel_stream_finalize",
    "mel_stream_nofinalize",
]


@pytest.fixture(scope="module")
def ref(reference_dir: Path) -> ReferenceSet:
    return ReferenceSet(reference_dir)


@pytest.fixture(scope="module")
def checks(ref: ReferenceSet) -> list[ArrayCheck]:
    return check_flow(ref)


@pytest.fixture
def fresh_flow(ref: ReferenceSet) -> CausalMaskedDiffWithXvec:
    return load_reference_flow(ref)


def _failed(checks: list[ArrayCheck]) -> set[str]:
    return {c.name for c in checks if not c.passed}


def test_every_flow_reference_array_is_checked_and_passes(checks: list[ArrayCheck]) -> None:
    names = [c.name for c in checks]
    assert names == [f"flow_reference:{a}" for a in EXPECTED_ARRAYS] + ["cfm_rand_noise:rand_noise"]
    assert _failed(checks) == set(), [c for c in checks if not c.passed]


def test_tolerances_are_the_readme_ones_or_tighter(checks: list[ArrayCheck]) -> None:
    by_name = {c.name: c for c in checks}
    assert by_name["flow_reference:mel_nonstream"].tolerance <= 1e-3
    assert all(by_name[f"flow_reference:est_out[{k}]"].tolerance <= 1e-4 for k in range(10))
    assert by_name["flow_reference:noise_z"].tolerance == 0.0
    assert by_name["cfm_rand_noise:rand_noise"].tolerance == 0.0


def test_full_size_keys_equal_keys_flow_txt(ref: ReferenceSet) -> None:
    assert check_flow_full_keys(ref) == []


def test_tiny_keys_equal_the_tiny_checkpoint_listing(ref: ReferenceSet) -> None:
    config = flow_config_from_reference(ref.config, "tiny")
    assert flow_key_differences(config, ref.root / "keys-flow-tiny.txt") == []


def test_key_check_reports_a_wrong_shape_and_a_missing_block(
    ref: ReferenceSet, tmp_path: Path
) -> None:
    lines = (ref.root / "keys-flow.txt").read_text().splitlines()
    edited = [
        line.replace("80x192", "80x191")
        if line.startswith("spk_embed_affine_layer.weight")
        else line
        for line in lines
    ]
    keys_file = tmp_path / "keys-flow.txt"
    keys_file.write_text("\n".join(edited) + "\n")
    full = flow_config_from_reference(ref.config, "full")
    problems = flow_key_differences(full, keys_file)
    assert problems == [
        "spk_embed_affine_layer.weight: ours 80x192/float32 != keys-flow.txt 80x191/float32"
    ]
    fewer_blocks = FlowConfig(encoder=FlowConfig().encoder.__class__(num_blocks=5))
    problems = flow_key_differences(fewer_blocks, ref.root / "keys-flow.txt")
    assert any("missing" in p and "encoder.encoders.5." in p for p in problems)


def test_perturbed_estimator_weight_fails_the_estimator_and_mel_checks(
    ref: ReferenceSet, fresh_flow: CausalMaskedDiffWithXvec
) -> None:
    with torch.no_grad():
        fresh_flow.decoder.estimator.final_proj.bias[0] += 1e-2
    failed = _failed(compare_flow(fresh_flow, ref))
    assert {"flow_reference:est_out[0]", "flow_reference:mel_nonstream"} <= failed
    assert "flow_reference:encoder_out" not in failed


def test_perturbed_relative_position_bias_fails_the_encoder_check(
    ref: ReferenceSet, fresh_flow: CausalMaskedDiffWithXvec
) -> None:
    with torch.no_grad():
        fresh_flow.encoder.up_encoders[3].self_attn.pos_bias_v += 0.05
    failed = _failed(compare_flow(fresh_flow, ref))
    assert "flow_reference:encoder_out" in failed
    assert "flow_reference:spk_proj" not in failed


def test_perturbed_noise_buffer_fails_the_noise_checks(
    ref: ReferenceSet, fresh_flow: CausalMaskedDiffWithXvec
) -> None:
    fresh_flow.decoder.rand_noise[0, 0, 0] += 1e-3
    failed = _failed(compare_flow(fresh_flow, ref))
    assert {"flow_reference:noise_z", "cfm_rand_noise:rand_noise"} <= failed


def test_perturbed_input_token_fails(ref: ReferenceSet, tmp_path: Path) -> None:
    for name in ("config.json", "flow.pt", "cfm_rand_noise.npz"):
        (tmp_path / name).symlink_to(ref.root / name)
    arrays = ref.arrays("flow_reference.npz")
    arrays["token"] = arrays["token"].copy()
    arrays["token"][0, 5] = (arrays["token"][0, 5] + 1) % 6561
    np.savez(tmp_path / "flow_reference.npz", **arrays)
    failed = _failed(check_flow(ReferenceSet(tmp_path)))
    assert {"flow_reference:encoder_out", "flow_reference:mel_nonstream"} <= failed


def test_missing_streaming_arrays_are_optional(ref: ReferenceSet, tmp_path: Path) -> None:
    shutil.copy(ref.root / "config.json", tmp_path / "config.json")
    (tmp_path / "flow.pt").symlink_to(ref.root / "flow.pt")
    arrays = ref.arrays("flow_reference.npz")
    del arrays["mel_stream_finalize"], arrays["mel_stream_nofinalize"]
    np.savez(tmp_path / "flow_reference.npz", **arrays)
    checks = check_flow(ReferenceSet(tmp_path))
    assert not any("mel_stream" in c.name for c in checks)
    assert _failed(checks) == set()
