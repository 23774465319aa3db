"""The flow estimator's transformer products in 8 bits through ONNX Runtime (the bench's
`bench flow --flow-precision int8`; no worker setting: it did not pay on the Zen 4).

Agreement bounds (tiny model, 30 tokens after 10 prompt tokens, 10 Euler steps): the mel with
int8 products measured 51.6 dB against fp32 in fp32 and 41.3 dB in bf16 on a VNNI host (a Zen 3
without VNNI, 7-bit weights: 41+ and 32+); the tests hold 40 and 32 dB, and each product's
output 30 dB (int8 weights and rows).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from workers.model.cpu_linear import Linear
from workers.model.flow.estimator import SelfAttention
from workers.model.flow.int8_products import (
    INT8_MAX,
    PROBE_K,
    REDUCED_MAX,
    Int8Product,
    int8_linear,
    probe_product,
    quantize_products,
    weight_range,
)
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.model.loader import load_model


def snr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    error = float(((reference.double() - other.double()) ** 2).sum())
    return 10 * float(np.log10(float((reference.double() ** 2).sum()) / error))


@torch.inference_mode()
def mel(flow: CausalMaskedDiffWithXvec, dtype: torch.dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    cfg = flow.config
    token = torch.randint(0, cfg.vocab_size, (1, 30), generator=g)
    prompt_token = torch.randint(0, cfg.vocab_size, (1, 10), generator=g)
    prompt_feat = torch.randn(1, 20, cfg.mel_bins, generator=g).to(dtype)
    embedding = torch.randn(1, cfg.spk_embed_dim, generator=g).to(dtype)
    return flow.inference(token, prompt_token, prompt_feat, embedding)[0]


@pytest.mark.parametrize(("dtype", "bound_db"), [(torch.float32, 40.0), (torch.bfloat16, 32.0)])
def test_int8_products_keep_the_mel_within_the_bound(
    tiny_model_dir: Path, dtype: torch.dtype, bound_db: float
) -> None:
    reference = load_model(tiny_model_dir).flow
    flow = load_model(tiny_model_dir, dtype=dtype).flow
    assert isinstance(reference, CausalMaskedDiffWithXvec)
    assert isinstance(flow, CausalMaskedDiffWithXvec)
    blocks = quantize_products(flow.decoder.estimator, threads=2)
    config = flow.config.estimator
    assert blocks == config.n_blocks * (2 + config.num_mid_blocks)  # down, mids, up
    attn = next(m for m in flow.modules() if isinstance(m, SelfAttention))
    assert isinstance(attn.qkv, Int8Product) and attn.to_q.weight.numel() == 0
    result = mel(flow, dtype)
    assert result.dtype == torch.float32 and torch.isfinite(result).all()
    assert snr_db(mel(reference, torch.float32), result) >= bound_db


def test_one_product_is_the_linears_within_int8_error() -> None:
    torch.manual_seed(0)
    parts = [Linear(64, 32), Linear(64, 48, bias=False)]
    x = torch.randn(3, 20, 64)
    product = int8_linear(parts, threads=1)
    with torch.inference_mode():
        expected = torch.cat([part(x) for part in parts], dim=-1)
        got = product(x)
        assert got.shape == (3, 20, 80) and got.dtype == torch.float32
        assert snr_db(expected, got) >= 30.0
        assert product(x.bfloat16()).dtype == torch.bfloat16


def test_project_gives_the_three_linears_or_the_joined_product() -> None:
    torch.manual_seed(0)
    attn = SelfAttention(32, heads=2, head_dim=8)
    x = torch.randn(2, 5, 32)
    with torch.inference_mode():
        plain = attn.project(x)
        linears = (attn.to_q, attn.to_k, attn.to_v)
        assert all(torch.equal(a, b(x)) for a, b in zip(plain, linears, strict=True))
        attn.qkv = int8_linear([attn.to_q, attn.to_k, attn.to_v], threads=1)
        joined = attn.project(x)
    for a, b in zip(plain, joined, strict=True):
        assert a.shape == b.shape == (2, 5, 16) and snr_db(a, b) >= 30.0


def test_the_weights_range_keeps_a_saturating_product_exact_on_this_cpu() -> None:
    """Without VNNI, ORT's u8 x s8 pairs saturate 16 bits (a Zen 3: 32.4 for 64, the mel at
    27 dB): the weights then take 7 bits, where the same product is exact."""
    assert weight_range() in (INT8_MAX, REDUCED_MAX)
    assert probe_product(weight_range()) == pytest.approx(PROBE_K, abs=1e-3)
    assert probe_product(REDUCED_MAX) == pytest.approx(PROBE_K, abs=1e-3)  # exact everywhere
