"""Strict loading of flow.pt: every key used, none missing, shapes equal, errors name the file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.errors import ModelLoadError
from workers.model.checkpoint import read_state_dict
from workers.model.flow.config import FlowConfig
from workers.model.flow.model import build_flow
from workers.tools.reference.configs import flow_config_from_reference
from workers.tools.reference.parity import ReferenceSet


@pytest.fixture(scope="module")
def tiny_config(reference_dir: Path) -> FlowConfig:
    return flow_config_from_reference(ReferenceSet(reference_dir).config, "tiny")


@pytest.fixture
def state(reference_dir: Path) -> dict[str, torch.Tensor]:
    return read_state_dict(reference_dir / "flow.pt")


def test_official_checkpoint_loads_strictly(
    tiny_config: FlowConfig, state: dict[str, torch.Tensor]
) -> None:
    flow = build_flow(tiny_config, state, source="flow.pt")
    assert not flow.training
    assert not any(p.requires_grad for p in flow.parameters())
    assert all(p.device.type == "cpu" for p in flow.parameters())
    key = "decoder.estimator.final_proj.bias"
    assert torch.equal(flow.state_dict()[key], state[key])


def test_missing_key_is_named(tiny_config: FlowConfig, state: dict[str, torch.Tensor]) -> None:
    del state["encoder.up_encoders.2.self_attn.pos_bias_u"]
    with pytest.raises(ModelLoadError, match=r"flow\.pt.*1 missing keys: encoder\.up_encoders\.2"):
        build_flow(tiny_config, state, source="flow.pt")


def test_extra_key_is_named(tiny_config: FlowConfig, state: dict[str, torch.Tensor]) -> None:
    state["decoder.rand_noise"] = torch.zeros(1, 80, 10)
    with pytest.raises(ModelLoadError, match=r"unexpected keys: decoder\.rand_noise"):
        build_flow(tiny_config, state, source="flow.pt")


def test_wrong_shape_is_named_with_both_shapes(
    tiny_config: FlowConfig, state: dict[str, torch.Tensor]
) -> None:
    state["spk_embed_affine_layer.weight"] = torch.zeros(80, 191)
    with pytest.raises(
        ModelLoadError, match=r"spk_embed_affine_layer\.weight \(80, 191\) != \(80, 192\)"
    ):
        build_flow(tiny_config, state, source="flow.pt")


def test_config_of_another_size_does_not_load(
    reference_dir: Path, state: dict[str, torch.Tensor]
) -> None:
    full = flow_config_from_reference(ReferenceSet(reference_dir).config, "full")
    with pytest.raises(ModelLoadError, match="does not match the model configuration"):
        build_flow(full, state, source="flow.pt")


def test_truncated_checkpoint_names_the_file(reference_dir: Path, tmp_path: Path) -> None:
    truncated = tmp_path / "flow.pt"
    truncated.write_bytes((reference_dir / "flow.pt").read_bytes()[:100_000])
    with pytest.raises(ModelLoadError, match=str(truncated)):
        read_state_dict(truncated)
