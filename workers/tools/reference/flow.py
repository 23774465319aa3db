"""Parity of our flow stage with the official reference arrays (`flow_reference.npz`).

`check_flow` builds the tiny flow from the set's `config.json`, loads `flow.pt` strictly, runs the
non-streaming inference recording every estimator call, and compares the speaker projection,
encoder output, mu, the noise, the estimator's batch-of-2 inputs, each Euler step's output and
the final mel; the streaming mels too when the set has them. `check_flow_full_keys` builds the
FULL configuration on the meta device and compares its state-dict keys with `keys-flow.txt`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from workers.model.checkpoint import read_state_dict
from workers.model.flow.config import FlowConfig
from workers.model.flow.model import CausalMaskedDiffWithXvec, EulerStep, build_flow
from workers.tools.reference.configs import flow_config_from_reference
from workers.tools.reference.parity import (
    ArrayCheck,
    ReferenceSet,
    compare,
    describe_state,
    key_list_differences,
    read_key_list,
)

CPU = torch.device("cpu")
REFERENCE_FILE = "flow_reference.npz"
NOISE_FILE = "cfm_rand_noise.npz"
FULL_KEYS_FILE = "keys-flow.txt"
# The reference README's suggested tolerances for a float32 re-implementation.
INTERMEDIATE_TOL = 1e-4
MEL_TOL = 1e-3
EXACT_TOL = 0.0  # copies and the seeded noise must be bit-identical
STREAMING = {"mel_stream_finalize": True, "mel_stream_nofinalize": False}  # array -> finalize


def _name(array: str) -> str:
    return f"flow_reference:{array}"


def _inputs(arrays: dict[str, np.ndarray], device: torch.device) -> tuple[torch.Tensor, ...]:
    """token, prompt_token, prompt_feat, embedding: the reference call's inputs, in order."""
    keys = ("token", "prompt_token", "prompt_feat", "embedding")
    return tuple(torch.from_numpy(arrays[k]).to(device) for k in keys)


def _step_checks(steps: list[EulerStep], arrays: dict[str, np.ndarray]) -> list[ArrayCheck]:
    """The estimator inputs (shared by all steps) and each step's x, t and output."""
    if not steps:
        return [compare(_name("est_out"), np.zeros(0), arrays["est_out"], INTERMEDIATE_TOL)]
    first = steps[0]
    checks = [
        compare(_name("est_mask"), first.mask, arrays["est_mask"], EXACT_TOL),
        compare(_name("est_mu"), first.mu, arrays["est_mu"], INTERMEDIATE_TOL),
        compare(_name("est_spks"), first.spks, arrays["est_spks"], INTERMEDIATE_TOL),
        compare(_name("est_cond"), first.cond, arrays["est_cond"], EXACT_TOL),
    ]
    if len(steps) != len(arrays["est_out"]):
        detail = f"{len(steps)} Euler steps, reference has {len(arrays['est_out'])}"
        return [*checks, ArrayCheck(_name("est_out"), float("inf"), INTERMEDIATE_TOL, True, detail)]
    checks.append(
        compare(
            _name("est_x"), torch.stack([s.x for s in steps]), arrays["est_x"], INTERMEDIATE_TOL
        )
    )
    checks.append(
        compare(
            _name("est_t"), torch.stack([s.t for s in steps]), arrays["est_t"], INTERMEDIATE_TOL
        )
    )
    checks += [
        compare(_name(f"est_out[{k}]"), step.velocity, arrays["est_out"][k], INTERMEDIATE_TOL)
        for k, step in enumerate(steps)
    ]
    return checks


def _streaming_checks(
    flow: CausalMaskedDiffWithXvec, arrays: dict[str, np.ndarray], device: torch.device
) -> list[ArrayCheck]:
    """The optional streaming mels (static chunk masks), when the set has them."""
    checks = []
    for array, finalize in STREAMING.items():
        if array in arrays:
            mel, _ = flow.inference(*_inputs(arrays, device), streaming=True, finalize=finalize)
            checks.append(compare(_name(array), mel, arrays[array], MEL_TOL))
    return checks


def load_reference_flow(ref: ReferenceSet, device: torch.device = CPU) -> CausalMaskedDiffWithXvec:
    """The set's tiny flow, built from `config.json` and loaded strictly from `flow.pt`."""
    config = flow_config_from_reference(ref.config, "tiny")
    path = ref.checkpoint("flow")
    return build_flow(config, read_state_dict(path), device=device, source=path)


def check_flow(ref: ReferenceSet, device: torch.device = CPU) -> list[ArrayCheck]:
    """One comparison per reference array of the flow stage (and the CFM noise buffer)."""
    return compare_flow(load_reference_flow(ref, device), ref, device)


@torch.inference_mode()
def compare_flow(
    flow: CausalMaskedDiffWithXvec, ref: ReferenceSet, device: torch.device = CPU
) -> list[ArrayCheck]:
    """Run `flow` on the reference inputs and compare with every stored flow array."""
    arrays = ref.arrays(REFERENCE_FILE)
    steps: list[EulerStep] = []
    mel, mid = flow.inference(*_inputs(arrays, device), record=steps)
    checks = [
        compare(_name("spk_proj"), mid.spk_proj, arrays["spk_proj"], INTERMEDIATE_TOL),
        compare(_name("encoder_out"), mid.encoder_out, arrays["encoder_out"], INTERMEDIATE_TOL),
        compare(_name("mu"), mid.mu, arrays["mu"], INTERMEDIATE_TOL),
        compare(_name("noise_z"), mid.noise, arrays["noise_z"], EXACT_TOL),
        *_step_checks(mid.steps, arrays),
        compare(_name("mel_nonstream"), mel, arrays["mel_nonstream"], MEL_TOL),
        *_streaming_checks(flow, arrays, device),
    ]
    if ref.has(NOISE_FILE):
        stored = ref.arrays(NOISE_FILE)["rand_noise"]
        ours = flow.decoder.rand_noise.detach().cpu()
        checks.append(compare(f"{Path(NOISE_FILE).stem}:rand_noise", ours, stored, EXACT_TOL))
    return checks


def flow_key_differences(config: FlowConfig, keys_file: Path) -> list[str]:
    """Differences between our state dict (built on meta) and a `key<TAB>shape<TAB>dtype` list."""
    with torch.device("meta"):
        flow = CausalMaskedDiffWithXvec(config)
    return key_list_differences(
        describe_state(flow.state_dict()), read_key_list(keys_file), keys_file.name
    )


def check_flow_full_keys(ref: ReferenceSet) -> list[str]:
    """FULL-size flow keys/shapes/dtypes vs `keys-flow.txt`; an empty list means equal.

    The list is optional in a reference set: call this only when `ref.has("keys-flow.txt")`.
    """
    config: dict[str, Any] = ref.config
    return flow_key_differences(
        flow_config_from_reference(config, "full"), ref.root / FULL_KEYS_FILE
    )
