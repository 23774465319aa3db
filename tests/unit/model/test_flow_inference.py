"""Flow inference behaviour: fixed noise, int32/int64 tokens, input errors, traceable solver."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from shared.errors import InvalidRequestError
from workers.model.flow.config import CfmConfig, EstimatorConfig, FlowConfig, FlowEncoderConfig
from workers.model.flow.model import CausalMaskedDiffWithXvec, make_noise
from workers.tools.fixtures.random_weights import random_flow
from workers.tools.reference.flow import load_reference_flow
from workers.tools.reference.parity import ReferenceSet


@pytest.fixture(scope="module")
def ref(reference_dir: Path) -> ReferenceSet:
    return ReferenceSet(reference_dir)


@pytest.fixture(scope="module")
def flow(ref: ReferenceSet) -> CausalMaskedDiffWithXvec:
    return load_reference_flow(ref)


@pytest.fixture(scope="module")
def inputs(ref: ReferenceSet) -> dict[str, torch.Tensor]:
    arrays = ref.arrays("flow_reference.npz")
    keys = ("token", "prompt_token", "prompt_feat", "embedding")
    return {k: torch.from_numpy(arrays[k]) for k in keys}


def test_noise_equals_the_stored_buffer(ref: ReferenceSet) -> None:
    stored = ref.arrays("cfm_rand_noise.npz")["rand_noise"]
    assert np.array_equal(make_noise(CfmConfig(), 80).numpy(), stored)


def test_building_the_flow_leaves_the_global_rng_alone() -> None:
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    with torch.device("meta"):
        model = CausalMaskedDiffWithXvec(FlowConfig())
    assert torch.equal(torch.rand(3), expected)
    # The noise is real data on CPU even on a meta-built model, and not a checkpoint key.
    assert model.decoder.rand_noise.device.type == "cpu"
    assert model.decoder.rand_noise.shape == (1, 80, 15000)
    assert not any("rand_noise" in key for key in model.state_dict())


@torch.inference_mode()
def test_int32_and_int64_tokens_give_the_same_mel(
    flow: CausalMaskedDiffWithXvec, inputs: dict[str, torch.Tensor]
) -> None:
    as_int32, _ = flow.inference(**inputs)
    as_int64, _ = flow.inference(
        inputs["token"].long(),
        inputs["prompt_token"].long(),
        inputs["prompt_feat"],
        inputs["embedding"],
    )
    assert as_int32.shape == (1, 80, 80)
    assert torch.equal(as_int32, as_int64)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("prompt_feat", torch.zeros(1, 25, 80), r"prompt_feat: expected shape \(1, 26, 80\)"),
        ("token", torch.tensor([[1, 6561]], dtype=torch.int32), "token: id 6561 >= speech vocab"),
        ("token", torch.zeros(1, 0, dtype=torch.int32), r"token: expected shape \(1, N>0\)"),
        ("token", torch.zeros(1, 4), "token: expected integer ids"),
        ("embedding", torch.zeros(1, 80), r"embedding: expected shape \(1, 192\)"),
        ("token", torch.zeros(1, 7600, dtype=torch.int32), "exceed the noise buffer"),
    ],
)
def test_bad_inputs_raise_invalid_request_naming_the_field(
    flow: CausalMaskedDiffWithXvec,
    inputs: dict[str, torch.Tensor],
    field: str,
    value: torch.Tensor,
    message: str,
) -> None:
    with torch.inference_mode(), pytest.raises(InvalidRequestError, match=message):
        flow.inference(**{**inputs, field: value})


def test_non_final_chunk_needs_more_than_the_lookahead(
    flow: CausalMaskedDiffWithXvec, inputs: dict[str, torch.Tensor]
) -> None:
    short = inputs["token"][:, :3]
    with torch.inference_mode(), pytest.raises(InvalidRequestError, match="look-ahead"):
        flow.inference(**{**inputs, "token": short}, streaming=True, finalize=False)


@pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.trace:FutureWarning")
@torch.inference_mode()
def test_solver_traces_with_noise_as_input_and_any_length() -> None:
    """The Euler loop runs in a traced module; the trace is valid for other lengths."""
    small = FlowConfig(
        encoder=FlowEncoderConfig(width=32, attention_heads=2, linear_units=16, num_blocks=0),
        estimator=EstimatorConfig(
            channels=16, attention_head_dim=8, num_heads=2, n_blocks=1, num_mid_blocks=1
        ),
        cfm=CfmConfig(n_timesteps=3, noise_frames=64),
    )
    solver = random_flow(small, seed=2).decoder

    def example(frames: int) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(frames)
        noise = torch.randn(1, 80, frames, generator=g)
        mu, cond = torch.randn(1, 80, frames, generator=g), torch.randn(1, 80, frames, generator=g)
        return noise, mu, torch.ones(1, 1, frames), torch.randn(1, 80, generator=g), cond

    traced = torch.jit.trace(solver, example(24))
    for frames in (24, 37):
        assert torch.allclose(traced(*example(frames)), solver(*example(frames)), atol=1e-5)


def test_token_embedding_zeroes_padding_and_clamps_negative_ids(
    flow: CausalMaskedDiffWithXvec,
) -> None:
    tokens = torch.tensor([[5, 7, -1], [5, 7, 9]], dtype=torch.int32)
    with torch.inference_mode():
        h = flow.embed_tokens(tokens, torch.tensor([2, 3]))
        table = flow.input_embedding.weight
        assert torch.equal(h[0, 2], torch.zeros_like(h[0, 2]))
        assert torch.equal(h[1, 2], table[9])
        assert torch.equal(flow.embed_tokens(tokens)[0, 2], table[0])
