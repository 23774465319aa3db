"""Parity of CosyVoice 3's flow stage with the official arrays (`flow_reference.npz` of the
CosyVoice 3 set).

`check_dit_flow` builds the tiny DiT flow from the set's `config.json`, loads `flow.pt` strictly
(its `inv_freq` buffer included) and compares: the speaker projection, token embedding,
pre-look-ahead output (both finalize settings), mu, the noise, the estimator's batch-of-2
inputs, every Euler step, the DiT internals of call 0 (time embedding, input embedding, each
block, final norm), the streaming chunk mask and streaming call 0, and the three mels.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from workers.model.checkpoint import read_state_dict
from workers.model.dit.config import DiTFlowConfig
from workers.model.dit.model import CausalMaskedDiffWithDiT, build_dit_flow
from workers.model.flow.model import EulerStep
from workers.tools.reference.configs import dit_flow_config_from_reference
from workers.tools.reference.flow import INTERMEDIATE_TOL, MEL_TOL, NOISE_FILE, _step_checks
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
EXACT_TOL = 0.0
STREAMING = {"mel_stream_finalize": True, "mel_stream_nofinalize": False}  # array -> finalize


def _name(array: str) -> str:
    return f"flow_reference:{array}"


def _inputs(arrays: dict[str, np.ndarray], device: torch.device) -> tuple[Tensor, ...]:
    keys = ("token", "prompt_token", "prompt_feat", "embedding")
    return tuple(torch.from_numpy(arrays[k]).to(device) for k in keys)


def load_reference_dit_flow(
    ref: ReferenceSet, device: torch.device = CPU
) -> CausalMaskedDiffWithDiT:
    """The set's tiny CosyVoice 3 flow, built from `config.json`, loaded strictly from flow.pt."""
    config = dit_flow_config_from_reference(ref.config, "tiny")
    path = ref.checkpoint("flow")
    return build_dit_flow(config, read_state_dict(path), device=device, source=path)


def check_dit_flow(ref: ReferenceSet, device: torch.device = CPU) -> list[ArrayCheck]:
    """One comparison per array of the CosyVoice 3 flow reference (and the CFM noise)."""
    return compare_dit_flow(load_reference_dit_flow(ref, device), ref, device)


@contextmanager
def _first_outputs(modules: dict[str, nn.Module]) -> Iterator[dict[str, Tensor]]:
    """Record each module's output of its first call (forward hooks, removed on exit)."""
    seen: dict[str, Tensor] = {}
    handles = []
    for name, module in modules.items():

        def hook(_m: nn.Module, _args: object, out: Tensor, name: str = name) -> None:
            seen.setdefault(name, out.detach().clone())

        handles.append(module.register_forward_hook(hook))
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def _internal_modules(flow: CausalMaskedDiffWithDiT) -> dict[str, nn.Module]:
    est = flow.decoder.estimator
    modules: dict[str, nn.Module] = {
        "dit_step0_time_emb": est.time_embed,
        "dit_step0_input_embed": est.input_embed,
    }
    modules |= {f"dit_step0_block{i}_out": block for i, block in enumerate(est.transformer_blocks)}
    return modules | {"dit_step0_norm_out": est.norm_out}


@torch.inference_mode()
def compare_dit_flow(
    flow: CausalMaskedDiffWithDiT, ref: ReferenceSet, device: torch.device = CPU
) -> list[ArrayCheck]:
    """Run `flow` on the reference inputs and compare with every stored flow array."""
    arrays = ref.arrays(REFERENCE_FILE)
    steps: list[EulerStep] = []
    with _first_outputs(_internal_modules(flow)) as internals:
        mel, mid = flow.inference(*_inputs(arrays, device), record=steps)
    checks = [
        compare(_name("spk_proj"), mid.spk_proj, arrays["spk_proj"], INTERMEDIATE_TOL),
        compare(_name("token_embedding"), mid.token_embedding, arrays["token_embedding"], 0.0),
        compare(
            _name("prelookahead_out"),
            mid.prelookahead_out,
            arrays["prelookahead_out"],
            INTERMEDIATE_TOL,
        ),
        compare(_name("mu"), mid.mu, arrays["mu"], INTERMEDIATE_TOL),
        compare(_name("noise_z"), mid.noise, arrays["noise_z"], EXACT_TOL),
        *_step_checks(mid.steps, arrays),
    ]
    checks += [
        compare(_name(name), internals.get(name, np.zeros(0)), arrays[name], INTERMEDIATE_TOL)
        for name in _internal_modules(flow)
        if name in arrays
    ]
    checks.append(compare(_name("mel_nonstream"), mel, arrays["mel_nonstream"], MEL_TOL))
    checks += _streaming_checks(flow, arrays, device)
    if ref.has(NOISE_FILE):
        stored = ref.arrays(NOISE_FILE)["rand_noise"]
        ours = flow.decoder.rand_noise.detach().cpu()
        checks.append(compare(f"{Path(NOISE_FILE).stem}:rand_noise", ours, stored, EXACT_TOL))
    return checks


def _streaming_checks(
    flow: CausalMaskedDiffWithDiT, arrays: dict[str, np.ndarray], device: torch.device
) -> list[ArrayCheck]:
    """Chunk mask, streaming estimator call 0, the streaming mels and the look-ahead output."""
    inputs = _inputs(arrays, device)
    steps: list[EulerStep] = []
    mel, _ = flow.inference(*inputs, streaming=True, finalize=True, record=steps)
    mask = flow.decoder.estimator.attention_mask(steps[0].mask, streaming=True)[0, 0]
    checks = [
        compare(_name("dit_stream_attn_mask"), mask, arrays["dit_stream_attn_mask"], EXACT_TOL),
        compare(
            _name("est_out_stream_step0"),
            steps[0].velocity,
            arrays["est_out_stream_step0"],
            INTERMEDIATE_TOL,
        ),
        compare(_name("mel_stream_finalize"), mel, arrays["mel_stream_finalize"], MEL_TOL),
    ]
    mel, mid = flow.inference(*inputs, streaming=True, finalize=False)
    checks.append(
        compare(_name("mel_stream_nofinalize"), mel, arrays["mel_stream_nofinalize"], MEL_TOL)
    )
    checks.append(
        compare(
            _name("prelookahead_out_nofinalize"),
            mid.prelookahead_out,
            arrays["prelookahead_out_nofinalize"],
            INTERMEDIATE_TOL,
        )
    )
    return checks


def dit_flow_key_differences(config: DiTFlowConfig, keys_file: Path) -> list[str]:
    """Differences between our state dict (built on meta) and a `key<TAB>shape<TAB>dtype` list."""
    with torch.device("meta"):
        flow = CausalMaskedDiffWithDiT(config)
    return key_list_differences(
        describe_state(flow.state_dict()), read_key_list(keys_file), keys_file.name
    )
