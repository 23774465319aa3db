"""The micro model: CosyVoice 2's architecture with very small widths, random weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from workers.coreml.manifest import Manifest
from workers.model.bench_flow import random_state_dict
from workers.model.directory import YAML_FILE, ModelDirectory
from workers.model.flow_config import CfmConfig, EstimatorConfig, FlowConfig, FlowEncoderConfig
from workers.model.hift import HiFTGenerator
from workers.model.hift_config import HiFTConfig
from workers.model.tiny_config import TinySpec, render_yaml

MICRO = TinySpec(
    flow_width=64,
    encoder_heads=2,
    encoder_linear_units=64,
    encoder_blocks=1,
    estimator_channels=32,
    estimator_head_dim=16,
    estimator_heads=2,
    estimator_blocks=1,
    estimator_mid_blocks=0,
    hift_base_channels=16,
    hift_cond_channels=16,
)
# The same flow with ONE Euler step: for tests that convert the CFM again (seconds, not tens).
MICRO_FLOW = FlowConfig(
    encoder=FlowEncoderConfig(width=64, attention_heads=2, linear_units=64, num_blocks=1),
    estimator=EstimatorConfig(
        channels=32, attention_head_dim=16, num_heads=2, n_blocks=1, num_mid_blocks=0
    ),
    cfm=CfmConfig(n_timesteps=1),
)
VOICED_F0_BIAS = 150.0  # Hz: random f0 weights would leave every frame unvoiced (f0 near 0)


def write_micro_model_dir(root: Path, seed: int = 0) -> Path:
    """cosyvoice2.yaml + random flow.pt and hift.pt in the official layout (no LLM files)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / YAML_FILE).write_text(render_yaml(MICRO))
    yaml = ModelDirectory(root).yaml
    torch.save(random_state_dict(FlowConfig.from_model_yaml(yaml), seed), root / "flow.pt")
    torch.manual_seed(seed)
    hift = HiFTGenerator(HiFTConfig.from_model_yaml(yaml))
    with torch.no_grad():
        hift.f0_predictor.classifier.bias.fill_(VOICED_F0_BIAS)
    torch.save(hift.state_dict(), root / "hift.pt")
    return root


@dataclass(frozen=True)
class Converted:
    """The session's conversion of the micro model and what `cosyq-worker convert` printed."""

    model_dir: Path
    out_dir: Path
    manifest: Manifest
    cli_output: str
