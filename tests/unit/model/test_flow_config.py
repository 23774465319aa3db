"""Flow hyperparameters come from config.json or an upstream cosyvoice2.yaml, never from code."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from shared.errors import ModelLoadError
from workers.model.flow.config import EstimatorConfig, FlowConfig, FlowEncoderConfig
from workers.model.yaml_plain import load_plain_yaml
from workers.tools.fixtures.random_weights import random_flow
from workers.tools.reference.configs import flow_config_from_reference
from workers.tools.reference.parity import ReferenceSet


@pytest.fixture
def flow_yaml(published_yaml: Path) -> dict[str, Any]:
    return load_plain_yaml(published_yaml)


def test_full_reference_config_is_the_default(reference_dir: Path) -> None:
    assert flow_config_from_reference(ReferenceSet(reference_dir).config, "full") == FlowConfig()


def test_tiny_reference_config(reference_dir: Path) -> None:
    config = flow_config_from_reference(ReferenceSet(reference_dir).config, "tiny")
    assert config.encoder == FlowEncoderConfig(linear_units=64, num_blocks=1)
    assert config.estimator == EstimatorConfig(
        channels=64, attention_head_dim=16, num_heads=4, n_blocks=2, num_mid_blocks=2
    )


def test_upstream_yaml_gives_the_full_config(flow_yaml: dict[str, Any]) -> None:
    assert FlowConfig.from_model_yaml(flow_yaml) == FlowConfig()


def test_missing_yaml_key_is_named(flow_yaml: dict[str, Any]) -> None:
    del flow_yaml["flow"]["encoder"]["attention_heads"]
    with pytest.raises(ModelLoadError, match=r"flow\.encoder: missing key 'attention_heads'"):
        FlowConfig.from_model_yaml(flow_yaml)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("decoder", "estimator", "channels"), [256, 256], "exactly one U-Net level"),
        (("decoder", "cfm_params", "content", "t_scheduler"), "linear", "t_scheduler"),
        (("encoder", "use_cnn_module"), True, "use_cnn_module"),
        (("encoder", "input_size"), 256, "input_size"),
        (("decoder", "estimator", "in_channels"), 240, "in_channels 240"),
    ],
)
def test_unsupported_architecture_is_rejected(
    flow_yaml: dict[str, Any], path: tuple[str, ...], value: Any, message: str
) -> None:
    section = flow_yaml["flow"]
    for key in path[:-1]:
        section = section[key]
    section[path[-1]] = value
    with pytest.raises(ModelLoadError, match=message):
        FlowConfig.from_model_yaml(flow_yaml)


@torch.inference_mode()
def test_another_tiny_configuration_builds_and_runs(reference_dir: Path) -> None:
    """Sizes come from the file: other widths, depths and head counts work too."""
    raw = copy.deepcopy(ReferenceSet(reference_dir).config)
    flow = raw["tiny"]["flow"]
    flow["input_size"] = 96
    flow["encoder"].update(output_size=96, input_size=96, attention_heads=4, linear_units=32)
    flow["encoder"]["num_blocks"] = 2
    flow["decoder"]["estimator"].update(
        channels=[32], attention_head_dim=8, num_heads=2, n_blocks=1, num_mid_blocks=3
    )
    config = flow_config_from_reference(raw, "tiny")
    model = random_flow(config, seed=1)
    keys = model.state_dict()
    assert keys["encoder.encoders.1.self_attn.pos_bias_u"].shape == (4, 24)
    assert keys["decoder.estimator.mid_blocks.2.1.0.attn1.to_q.weight"].shape == (16, 32)
    assert "decoder.estimator.mid_blocks.3.0.mlp.1.weight" not in keys
    g = torch.Generator().manual_seed(0)
    mel, _ = model.inference(
        torch.randint(0, 6561, (1, 9), generator=g),
        torch.randint(0, 6561, (1, 4), generator=g),
        torch.randn(1, 8, 80, generator=g),
        torch.randn(1, 192, generator=g),
    )
    assert mel.shape == (1, 80, 18)
    assert torch.isfinite(mel).all()
