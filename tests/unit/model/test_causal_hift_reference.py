"""Parity of CosyVoice 3's causal HiFT and streaming session with the official arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from shared.errors import InvalidRequestError
from workers.model.causal_hift.model import CausalHiFTGenerator, build_causal_hift
from workers.model.causal_hift.source import SourceBuffer
from workers.model.causal_stream import StreamSchedule
from workers.model.checkpoint import read_state_dict
from workers.model.dit.model import CausalMaskedDiffWithDiT
from workers.tools.reference.causal_hift import (
    causal_hift_key_differences,
    check_causal_session,
    compare_causal_hift,
    load_reference_causal_hift,
)
from workers.tools.reference.configs import causal_hift_config_from_reference
from workers.tools.reference.dit_flow import load_reference_dit_flow
from workers.tools.reference.parity import ArrayCheck, ReferenceSet

HIFT_INPUTS = {"mel"}
SESSION_INPUTS = {"prompt_token", "prompt_feat", "embedding", "session_source_token"}


@pytest.fixture(scope="module")
def ref(reference3_dir: Path) -> ReferenceSet:
    return ReferenceSet(reference3_dir)


@pytest.fixture(scope="module")
def hift(ref: ReferenceSet) -> CausalHiFTGenerator:
    return load_reference_causal_hift(ref)


@pytest.fixture(scope="module")
def flow(ref: ReferenceSet) -> CausalMaskedDiffWithDiT:
    return load_reference_dit_flow(ref)


@pytest.fixture(scope="module")
def hift_checks(ref: ReferenceSet, hift: CausalHiFTGenerator) -> list[ArrayCheck]:
    return compare_causal_hift(hift, ref)


@pytest.fixture(scope="module")
def session_checks(
    ref: ReferenceSet, flow: CausalMaskedDiffWithDiT, hift: CausalHiFTGenerator
) -> list[ArrayCheck]:
    return check_causal_session(ref, flow, hift)


def _failed(checks: list[ArrayCheck]) -> set[str]:
    return {c.name for c in checks if not c.passed}


def test_every_hift_array_is_checked_and_passes(
    ref: ReferenceSet, hift_checks: list[ArrayCheck]
) -> None:
    stored = set(ref.arrays("hift_reference.npz")) - HIFT_INPUTS
    assert {c.name for c in hift_checks} == {f"hift_reference.npz:{n}" for n in stored}
    assert _failed(hift_checks) == set(), [c for c in hift_checks if not c.passed]
    by_name = {c.name: c for c in hift_checks}
    assert by_name["hift_reference.npz:wav"].tolerance <= 1e-4
    assert by_name["hift_reference.npz:real_model_sine_waves_first2400"].tolerance == 0.0


def test_every_session_array_is_checked_and_passes(
    ref: ReferenceSet, session_checks: list[ArrayCheck]
) -> None:
    stored = set(ref.arrays("session_reference.npz")) - SESSION_INPUTS
    assert {c.name for c in session_checks} == {f"session_reference:{n}" for n in stored}
    assert _failed(session_checks) == set(), [c for c in session_checks if not c.passed]


@pytest.mark.parametrize("listing", ["keys-hift.txt", "keys-hift-legacy-weightnorm.txt"])
def test_full_keys_equal_the_listings(ref: ReferenceSet, listing: str) -> None:
    config = causal_hift_config_from_reference(ref.config, "full")
    assert causal_hift_key_differences(config, ref.root / listing) == []


def test_tiny_keys_equal_the_tiny_listing(ref: ReferenceSet) -> None:
    config = causal_hift_config_from_reference(ref.config, "tiny")
    assert causal_hift_key_differences(config, ref.root / "keys-hift-tiny.txt") == []


def test_buffer_keeps_only_the_prefix_asked_for(hift: CausalHiFTGenerator) -> None:
    buffer = SourceBuffer(hift.config)
    first = buffer.prefix(480 * 50)
    assert buffer._cache.size(1) == 24000  # one second, not 300
    longer = buffer.prefix(480 * 60)
    assert buffer._cache.size(1) == 48000
    assert torch.equal(longer[:, : first.size(1)], first)
    with pytest.raises(InvalidRequestError, match="source buffer"):
        buffer.prefix(hift.config.buffer_samples + 1)


def test_a_perturbed_f0_weight_fails_f0_source_and_wav(ref: ReferenceSet) -> None:
    fresh = load_reference_causal_hift(ref)
    with torch.no_grad():
        fresh.f0_predictor.classifier.bias += 0.01
    failed = _failed(compare_causal_hift(fresh, ref))
    assert {"hift_reference.npz:f0_f64", "hift_reference.npz:source"} <= failed
    assert "hift_reference.npz:wav_fixed" not in failed


def test_first_hop_reaches_a_chunk_border() -> None:
    schedule = StreamSchedule()
    assert [schedule.first_hop(p) for p in (0, 13, 25, 26)] == [25, 37, 25, 49]


def test_bf16_vocoder_keeps_the_waveform_close(ref: ReferenceSet) -> None:
    config = causal_hift_config_from_reference(ref.config, "tiny")
    state = read_state_dict(ref.checkpoint("hift"))
    model = build_causal_hift(config, state, dtype=torch.bfloat16)
    arrays = ref.arrays("hift_reference.npz")
    wav = model.inference(torch.from_numpy(arrays["mel"])).wav.double().numpy()
    error = wav - arrays["wav"]
    snr_db = 10 * np.log10((arrays["wav"] ** 2).sum() / (error**2).sum())
    assert model.f0_predictor.classifier.weight.dtype == torch.float64  # F0 stays float64
    assert snr_db > 25
