"""bf16 CPU decoding fuses q/k/v and gate/up: the layer computes what the separate products do."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from workers.model import cpu_linear
from workers.model.cpu_linear import Linear
from workers.model.llm.fused_projections import fuse_projections
from workers.model.llm.qwen2 import Qwen2Config, Qwen2DecoderLayer, rotary_cos_sin
from workers.model.loader import load_model

CONFIG = Qwen2Config(
    hidden_size=64,
    num_layers=1,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=96,
    vocab_size=10,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=64,
)
needs_bf16_packing = pytest.mark.skipif(
    not cpu_linear.bf16_packing_available(),
    reason="this CPU runs no native bf16 in oneDNN (no AVX512-BF16 or AMX): nothing is fused",
)


def _layer(dtype: torch.dtype) -> Qwen2DecoderLayer:
    torch.manual_seed(0)
    layer = Qwen2DecoderLayer(CONFIG)
    with torch.no_grad():
        for param in layer.parameters():
            param.normal_(0.0, 0.2)
    return layer.to(dtype).eval().requires_grad_(False)


@needs_bf16_packing
@pytest.mark.parametrize("positions", [1, 7])
def test_fused_layer_gives_the_separate_products_result(positions: int) -> None:
    separate = _layer(torch.bfloat16)
    fused = copy.deepcopy(separate)
    assert fuse_projections(fused) == 2
    cpu_linear.pack_linear_weights(fused)
    attn, mlp = fused.self_attn, fused.mlp
    assert attn.qkv_proj is not None and mlp.gate_up_proj is not None
    assert attn.qkv_proj.weight.shape == (CONFIG.hidden_size + 2 * CONFIG.kv_dim, 64)
    assert attn.q_proj.weight.numel() == 0 and mlp.up_proj.weight.numel() == 0  # no second copy
    x = torch.randn(2, positions, CONFIG.hidden_size).bfloat16()
    rotary = rotary_cos_sin(CONFIG, 0, positions, torch.device("cpu"), torch.bfloat16)
    with torch.inference_mode():
        rotary32 = (rotary[0].float(), rotary[1].float())
        exact = copy.deepcopy(separate).float()(x.float(), rotary32, None, 0)
        want = separate(x, rotary, None, 0)
        got = fused(x, rotary, None, 0)
    # the fused products are the same dot products: no further from fp32 than the separate ones
    err_got = (got.float() - exact).pow(2).mean()
    err_want = (want.float() - exact).pow(2).mean()
    assert err_got <= 1.5 * err_want + 1e-6
    torch.testing.assert_close(got, want, rtol=3e-2, atol=3e-2)


def test_fp32_and_hosts_without_native_bf16_are_not_fused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert fuse_projections(_layer(torch.float32)) == 0
    monkeypatch.setattr("workers.model.llm.fused_projections.bf16_packing_available", lambda: False)
    layer = _layer(torch.bfloat16)
    assert fuse_projections(layer) == 0 and layer.self_attn.qkv_proj is None


@needs_bf16_packing
@pytest.mark.parametrize("amx", [False, True])
def test_a_loaded_bf16_model_is_fused_and_packed(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, amx: bool
) -> None:
    """Fused either way; the LLM's products packed, or plain under "gemv" on AMX hosts (the
    flow's stay packed on both)."""
    monkeypatch.setattr(cpu_linear, "has_amx_tiles", lambda: amx)
    loaded = load_model(tiny_model_dir, dtype=torch.bfloat16)
    layers = loaded.llm.backbone.layers
    assert all(layer.self_attn.qkv_proj is not None for layer in layers)
    assert all(layer.mlp.gate_up_proj is not None for layer in layers)
    fused = [p for layer in layers for p in (layer.self_attn.qkv_proj, layer.mlp.gate_up_proj)]
    assert all(p.kernel == ("gemv" if amx else "onednn") for p in fused)
    assert all(p.weight.is_mkldnn is not amx for p in fused)
    assert loaded.flow is not None
    flow_linears = [m for m in loaded.flow.modules() if isinstance(m, Linear)]
    assert flow_linears and all(m.weight.is_mkldnn for m in flow_linears if m.weight.dim() == 2)
