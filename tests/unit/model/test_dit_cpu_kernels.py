"""CosyVoice 3's DiT flow on CosyVoice 2's CPU kernels: what the loader gives it in bf16,
and that the kernels keep its output (fused q/k/v, packed weights, the GELU as a post-op,
blocked attention, the modulations as `addcmul`)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from workers.model import cpu_linear
from workers.model.dit.config import DiTConfig, DiTFlowConfig
from workers.model.dit.estimator import DiT
from workers.model.kernel_policy import apply_stage_policy, cpu_kernels_in, kernel_policy
from workers.model.loader import load_model
from workers.tools.fixtures.random_weights import random_dit_flow

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
SMALL = DiTFlowConfig(
    pre_lookahead_channels=32, estimator=DiTConfig(dim=128, depth=2, heads=2, dim_head=64)
)
needs_bf16_packing = pytest.mark.skipif(
    not cpu_linear.bf16_packing_available(),
    reason="this CPU runs no native bf16 in oneDNN (no AVX512-BF16 or AMX): nothing is packed",
)


def _snr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    error = (reference.double() - other.double()).pow(2).sum()
    return 10 * math.log10(float(reference.double().pow(2).sum() / error))


@needs_bf16_packing
def test_a_bf16_cpu_load_gives_the_dit_flow_its_kernels(
    tiny3_model_dir: Path, tmp_path: Path
) -> None:
    """The real loader: every DiT attention fused and blocked, its products packed; under
    CUDA's policy (on the CPU here) none of them."""
    dtype = torch.bfloat16
    model = load_model(tiny3_model_dir, dtype=dtype, hash_cache_dir=tmp_path)
    assert model.flow is not None
    found = cpu_kernels_in([model.flow])
    depth = model.configs.flow.estimator.depth  # type: ignore[union-attr]
    assert sum(line.endswith("attn: fused q/k/v") for line in found) == depth
    assert sum(line.endswith("attn: blocked attention") for line in found) == depth
    assert any(line.endswith("ff.ff.0.0: packed weight") for line in found)
    plain = load_model(
        tiny3_model_dir, dtype=dtype, hash_cache_dir=tmp_path, policy=kernel_policy(CUDA, dtype)
    )
    assert cpu_kernels_in([plain.flow]) == []  # type: ignore[list-item]


@needs_bf16_packing
def test_the_kernels_keep_the_bf16_mel_as_close_to_fp32(bf16_attention_kernel: str) -> None:
    """A whole flow pass (10 Euler steps, CFG as a batch of 2): bf16 on the CPU kernels is as
    close to fp32 as bf16 on plain PyTorch ops (and would be far off with a wrong kernel)."""
    flow = random_dit_flow(SMALL)
    g = torch.Generator().manual_seed(3)
    inputs = (
        torch.randint(0, SMALL.vocab_size, (1, 20), generator=g),
        torch.randint(0, SMALL.vocab_size, (1, 10), generator=g),
        torch.randn(1, 20, SMALL.mel_bins, generator=g),
        torch.randn(1, SMALL.spk_embed_dim, generator=g),
    )
    with torch.inference_mode():
        reference = flow.inference(*inputs)[0]
        flow.to(torch.bfloat16)
        apply_stage_policy(flow, kernel_policy(CUDA, torch.bfloat16), rows_alone=True)
        plain = flow.inference(*inputs)[0]
        apply_stage_policy(flow, kernel_policy(CPU, torch.bfloat16), rows_alone=True)
        assert cpu_kernels_in([flow]) != []
        kernels = flow.inference(*inputs)[0]
    assert _snr_db(reference, kernels) >= max(30.0, _snr_db(reference, plain) - 1.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_padded_frames_change_no_valid_frame(dtype: torch.dtype) -> None:
    """A row padded at its end with masked frames gives its valid frames what it gives alone
    (the position convs are causal, the padded keys hidden): the mask still reaches the
    attention when it hides something, in fp32 and on the bf16 CPU kernels."""
    torch.manual_seed(0)
    estimator = DiT(SMALL.estimator).eval().requires_grad_(False)
    for param in estimator.parameters():  # adaLN-Zero starts at zero: make every block count
        param.normal_(0.0, 0.1)
    estimator.to(dtype)
    apply_stage_policy(estimator, kernel_policy(CPU, dtype), rows_alone=True)
    g = torch.Generator().manual_seed(1)
    frames, pad = 30, 12
    x, mu, cond = (torch.randn(1, 80, frames + pad, generator=g).to(dtype) for _ in range(3))
    spks, t = torch.randn(1, 80, generator=g).to(dtype), torch.tensor([0.3], dtype=dtype)
    mask = torch.ones(1, 1, frames + pad, dtype=dtype)
    mask[..., frames:] = 0
    with torch.inference_mode():
        alone = estimator(x[..., :frames], mask[..., :frames], mu[..., :frames], t, spks,
                          cond[..., :frames])  # fmt: skip
        padded = estimator(x, mask, mu, t, spks, cond)[..., :frames]
        unmasked = estimator(x, torch.ones_like(mask), mu, t, spks, cond)[..., :frames]
    # fp32 ~133 dB. bf16: the same bits on AVX512-BF16 (Zen 4), 50.8 dB on AMX, whose oneDNN
    # kernels block a 30-row and a 42-row product differently (bf16's own rounding, ~8 bits);
    # the unmasked rows are at ~23 dB on both.
    floor_db = 60.0 if dtype == torch.float32 else 40.0
    assert _snr_db(alone, padded) >= floor_db
    assert _snr_db(alone, unmasked) < 30.0  # the padded keys do matter when not hidden
