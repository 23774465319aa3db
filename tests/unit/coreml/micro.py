"""The micro models: CosyVoice 2's and 3's architectures with very small widths, random
weights."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from workers.coreml.manifest import Manifest
from workers.model.flow.batch import FlowRow
from workers.model.flow.config import CfmConfig, EstimatorConfig, FlowConfig, FlowEncoderConfig
from workers.tools.fixtures.tiny import write_tiny_model
from workers.tools.fixtures.tiny3 import TinySpec3, write_tiny3_model
from workers.tools.fixtures.tiny_config import TinySpec

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
# The session conversion's Euler steps (`convert --flow-steps`): the CFM program unrolls each
# step, so the model's 10 made the conversion ~4x longer; what the tests check is per step.
FLOW_STEPS = 2
# The same flow with ONE Euler step and one conformer block after the upsampling (upstream's
# 4, which the yaml cannot change, are most of the encoder's ops: 6.5 s to convert it batched
# instead of 3.0): for tests that convert the flow again.
MICRO_FLOW = FlowConfig(
    encoder=FlowEncoderConfig(
        width=64, attention_heads=2, linear_units=64, num_blocks=1, num_up_blocks=1
    ),
    estimator=EstimatorConfig(
        channels=32, attention_head_dim=16, num_heads=2, n_blocks=1, num_mid_blocks=0
    ),
    cfm=CfmConfig(n_timesteps=1),
)


# CosyVoice 3 at micro size: one DiT block, half the tiny widths (the conversion's time is
# mostly per op, so depth is what counts; HiFT's op count is fixed by its structure).
MICRO3 = TinySpec3(
    lookahead_channels=32,
    dit_dim=32,
    dit_depth=1,
    dit_heads=2,
    dit_head_dim=16,
    hift_base_channels=16,
    hift_cond_channels=16,
)


# HiFT's residual blocks per upsampling stage (upstream's 3: kernels 3, 7, 11): they are most
# of HiFT's ops, and the conversion's time is per op; the three are alike but for the kernel.
MICRO_HIFT_RESBLOCKS = 1


def write_micro_model_dir(root: Path, seed: int = 0) -> Path:
    """A complete model directory (`init-tiny`'s writer) with the micro sizes."""
    return write_tiny_model(root, seed=seed, spec=MICRO, hift_resblocks=MICRO_HIFT_RESBLOCKS).root


def write_micro3_model_dir(root: Path, seed: int = 0) -> Path:
    """A complete CosyVoice 3 model directory (`init-tiny --family cosyvoice3`), micro sizes."""
    return write_tiny3_model(root, seed=seed, spec=MICRO3, hift_resblocks=MICRO_HIFT_RESBLOCKS).root


@dataclass(frozen=True)
class Converted:
    """The session's conversion of the micro model and what `cosyq-worker convert` printed."""

    model_dir: Path
    out_dir: Path
    manifest: Manifest
    cli_output: str


def flow_row(tokens: int, prompt: int, seed: int) -> FlowRow:
    """One seeded flow request (batch 1) of `tokens` tokens after a `prompt`-token prompt."""
    g = torch.Generator().manual_seed(seed)
    return FlowRow(
        torch.randint(0, 6561, (1, tokens), generator=g, dtype=torch.int32),
        torch.randint(0, 6561, (1, prompt), generator=g, dtype=torch.int32),
        torch.randn(1, 2 * prompt, 80, generator=g),
        torch.randn(1, 192, generator=g),
    )
