"""The flow benchmark helpers work on a small configuration (no timing is asserted)."""

from __future__ import annotations

import torch

from workers.model.flow.config import EstimatorConfig, FlowConfig, FlowEncoderConfig
from workers.tools.bench.flow_stage import time_flow
from workers.tools.fixtures.random_weights import random_flow, random_state_dict

SMALL = FlowConfig(
    encoder=FlowEncoderConfig(width=64, attention_heads=2, linear_units=32, num_blocks=1),
    estimator=EstimatorConfig(
        channels=32, attention_head_dim=8, num_heads=2, n_blocks=1, num_mid_blocks=1
    ),
)


def test_random_state_dict_has_the_official_layout_and_unit_norms() -> None:
    state = random_state_dict(SMALL, seed=3)
    assert torch.equal(state["encoder.after_norm.weight"], torch.ones(64))
    assert torch.equal(state["encoder.encoders.0.self_attn.linear_q.bias"], torch.zeros(64))
    assert 0.01 < float(state["input_embedding.weight"].std()) < 0.03
    assert torch.equal(
        random_state_dict(SMALL, seed=3)["encoder_proj.weight"], state["encoder_proj.weight"]
    )


def test_time_flow_reports_every_stage_for_each_run() -> None:
    timing = time_flow(random_flow(SMALL), tokens=6, prompt_tokens=4, threads=1, runs=2, warmup=0)
    assert timing.mel_frames == 20
    assert timing.runs == 2
    assert [name for name, _, _ in timing.rows()][-1] == "flow total"
    assert all(total >= cfm > 0 for total, cfm in zip(timing.total_s, timing.cfm_s, strict=True))
