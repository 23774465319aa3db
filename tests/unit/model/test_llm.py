"""LLM stage: parity with the official reference arrays, strict loading, FULL key layout."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from shared.errors import ModelLoadError
from workers.model.checkpoint import read_state_dict
from workers.model.cpu_linear import onednn_available
from workers.model.llm.model import LLMConfig, Qwen2LM, build_llm
from workers.tools.reference.configs import llm_config_from_reference
from workers.tools.reference.llm import (
    ARRAYS,
    check_llm,
    check_llm_full_keys,
    llm_checks,
)
from workers.tools.reference.parity import ReferenceSet

KERNELS = [
    "torch",
    pytest.param(
        "onednn",
        marks=pytest.mark.skipif(
            not onednn_available(), reason="this torch build has no oneDNN linear"
        ),
    ),
]


@pytest.fixture(scope="module")
def ref(reference_dir: Path) -> ReferenceSet:
    return ReferenceSet(reference_dir)


@pytest.fixture(scope="module")
def state(ref: ReferenceSet) -> dict[str, torch.Tensor]:
    return read_state_dict(ref.checkpoint("llm"))


@pytest.fixture(scope="module")
def config(ref: ReferenceSet) -> LLMConfig:
    return llm_config_from_reference(ref.config, "tiny")


def _failed(checks: list) -> set[str]:
    return {c.name.split(":")[1] for c in checks if c.max_abs_error > c.tolerance}


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_reference_array_matches(ref: ReferenceSet, kernel: str) -> None:
    checks = check_llm(ref, torch.device("cpu"), kernel=kernel)
    names = {c.name for c in checks}
    assert {"llm_reference:logits", "llm_reference:infer_step_logp"} <= names
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    # Not gated in check-reference (torch's multinomial could change), but exact here:
    # our seeded sampler draws upstream's tokens.
    assert _failed(checks) == set()


def test_perturbed_weight_fails_the_checks(
    ref: ReferenceSet, state: dict, config: LLMConfig
) -> None:
    bad = dict(state)
    key = "llm.model.model.layers.1.mlp.down_proj.weight"
    bad[key] = state[key] + 1e-2 * torch.randn(
        state[key].shape, generator=torch.Generator().manual_seed(0)
    )
    model = build_llm(config, bad, source="perturbed")
    failed = _failed(llm_checks(model, ref.arrays(ARRAYS)))
    assert {"hidden", "logits", "target_logits", "infer_step_logp"} <= failed
    assert "lm_input" not in failed  # embeddings untouched


def test_perturbed_inputs_fail_the_checks(
    ref: ReferenceSet, state: dict, config: LLMConfig
) -> None:
    model = build_llm(config, state, source="llm.pt")
    arrays = ref.arrays(ARRAYS)
    swapped = dict(arrays, prompt_text=arrays["prompt_text"][:, ::-1].copy())
    assert "lm_input" in _failed(llm_checks(model, swapped))
    tokens = arrays["infer_sampled_tokens"].copy()
    tokens[0, 3] = (tokens[0, 3] + 1) % 6561  # feed one wrong token into the KV cache
    failed = _failed(llm_checks(model, dict(arrays, infer_sampled_tokens=tokens)))
    assert "infer_step_logp" in failed
    assert "logits" not in failed


def test_full_size_keys_match_the_official_list(ref: ReferenceSet) -> None:
    assert check_llm_full_keys(ref) == []


def test_full_key_check_reports_a_difference(ref: ReferenceSet, tmp_path: Path) -> None:
    shutil.copy(ref.root / "config.json", tmp_path / "config.json")
    lines = (ref.root / "keys-llm.txt").read_text().splitlines()
    lines = [ln.replace("896x4864", "896x4865") if ".23.mlp.down" in ln else ln for ln in lines]
    lines = [ln for ln in lines if "lm_head" not in ln]
    (tmp_path / "keys-llm.txt").write_text("\n".join(lines) + "\n")
    problems = check_llm_full_keys(ReferenceSet(tmp_path))
    assert any("layers.23.mlp.down_proj.weight" in p and "4865" in p for p in problems)
    assert any("lm_head.weight" in p for p in problems)


def test_head_is_tied_and_costs_no_memory(state: dict, config: LLMConfig) -> None:
    model = build_llm(config, state, source="llm.pt")
    keys = list(model.state_dict())
    assert "llm.model.lm_head.weight" in keys
    assert model.llm.model.lm_head.weight is model.llm.model.model.embed_tokens.weight
    assert sum(p.numel() for p in model.parameters()) == 986_724  # unique parameters
    embed = state["llm.model.model.embed_tokens.weight"]
    assert model.llm.model.lm_head.weight.data_ptr() == embed.data_ptr()  # no copy made


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda s: s.pop("llm.model.lm_head.weight"), "missing keys: llm.model.lm_head.weight"),
        (lambda s: s.pop("llm_decoder.bias"), "missing keys: llm_decoder.bias"),
        (lambda s: s.update(extra=torch.zeros(1)), "unexpected keys: extra"),
        (
            lambda s: s.update({"speech_embedding.weight": torch.zeros(6563, 64)}),
            "speech_embedding.weight (6563, 64) != (6564, 64)",
        ),
    ],
)
def test_strict_load_names_the_problem(state: dict, config: LLMConfig, edit, expected: str) -> None:
    bad = dict(state)
    edit(bad)
    with pytest.raises(ModelLoadError, match=r"llm\.pt") as info:
        build_llm(config, bad, source="somewhere/llm.pt")
    assert expected in str(info.value)


def test_corrupt_checkpoint_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "llm.pt"
    path.write_bytes(b"not a zip")
    with pytest.raises(ModelLoadError, match=r"llm\.pt"):
        read_state_dict(path)


def test_meta_construction_needs_no_memory(ref: ReferenceSet) -> None:
    with torch.device("meta"):
        model = Qwen2LM(llm_config_from_reference(ref.config, "full"))
    assert all(p.is_meta for p in model.parameters())
    unique = sum(p.numel() for p in model.parameters())
    assert unique == ref.config["full"]["files"]["llm"]["total_unique_params"]
