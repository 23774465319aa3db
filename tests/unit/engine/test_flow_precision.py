"""`COSYQ_FLOW_PRECISION`: the flow's transformer products in 8 bits through ONNX Runtime.

Agreement bounds (tiny model, 30 tokens after 10 prompt tokens, 10 Euler steps): the mel with
int8 products measured 51.6 dB against fp32 in fp32 and 41.3 dB in bf16 (bf16 alone ~42);
the tests hold 40 and 32 dB, and each product's output 30 dB (int8 weights and rows).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import soundfile
import torch
from structlog.testing import capture_logs

from shared.errors import ModelLoadError, SettingsError
from shared.settings import Settings, load_settings
from workers.engine.api import SynthesisInput
from workers.engine.cpu_features import HostCPU, host_cpu
from workers.engine.flow_precision import INT8_DOT_FLAGS, choose_flow_precision
from workers.engine.pipeline import EngineOptions, build_engine
from workers.model.cpu_linear import Linear
from workers.model.flow.estimator import SelfAttention
from workers.model.flow.int8_products import Int8Product, int8_linear, quantize_products
from workers.model.flow.model import CausalMaskedDiffWithXvec
from workers.model.loader import load_model
from workers.service.default_engine import flow_precision_for

CPU = torch.device("cpu")


def host(*flags: str) -> HostCPU:
    return HostCPU(model="Test CPU", machine="x86_64", flags=flags, cores=2)


def snr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    error = float(((reference.double() - other.double()) ** 2).sum())
    return 10 * np.log10(float((reference.double() ** 2).sum()) / error)


def flow_inputs(flow: CausalMaskedDiffWithXvec) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    cfg = flow.config
    token = torch.randint(0, cfg.vocab_size, (1, 30), generator=g)
    prompt_token = torch.randint(0, cfg.vocab_size, (1, 10), generator=g)
    prompt_feat = torch.randn(1, 20, cfg.mel_bins, generator=g)
    embedding = torch.randn(1, cfg.spk_embed_dim, generator=g)
    return token, prompt_token, prompt_feat, embedding


@torch.inference_mode()
def mel(flow: CausalMaskedDiffWithXvec, dtype: torch.dtype) -> torch.Tensor:
    token, prompt_token, prompt_feat, embedding = flow_inputs(flow)
    return flow.inference(token, prompt_token, prompt_feat.to(dtype), embedding.to(dtype))[0]


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
        attn.qkv = int8_linear([attn.to_q, attn.to_k, attn.to_v], threads=1)
        joined = attn.project(x)
    for a, b in zip(plain, joined, strict=True):
        assert a.shape == b.shape == (2, 5, 16) and snr_db(a, b) >= 30.0


def test_the_setting_defaults_to_native_and_int8_is_refused_where_it_cannot_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in list(os.environ):
        if name.upper().startswith("COSYQ_") and name.lower()[6:] in Settings.model_fields:
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    assert load_settings().flow_precision == "native"
    monkeypatch.setenv("COSYQ_FLOW_PRECISION", "auto")  # no auto: one host class measured
    with pytest.raises(SettingsError, match=r"(?i)flow_precision"):
        load_settings()
    vnni = host("avx2", "avx512f", "avx512_vnni")
    assert choose_flow_precision("native", device=CPU, host=host("avx2")).name == "native"
    assert choose_flow_precision("int8", device=CPU, host=vnni).name == "int8"
    assert choose_flow_precision("int8", device=CPU, host=host("avx2", "avx_vnni")).name == "int8"
    refusals = {
        "int8 dot-product": dict(device=CPU, host=host("avx2", "fma")),
        "CosyVoice 2's flow only": dict(device=CPU, host=vnni, family="cosyvoice3"),
        "not torch on mps": dict(device=torch.device("mps"), host=vnni),
        "not coreml on cpu": dict(device=CPU, host=vnni, backend="coreml"),
    }
    for words, kwargs in refusals.items():
        with pytest.raises(ModelLoadError) as refused:
            choose_flow_precision("int8", **kwargs)  # type: ignore[arg-type]
        message = str(refused.value)
        assert words in message and "COSYQ_FLOW_PRECISION=int8" in message
        assert "\n" not in message and message.endswith("set it to native")


def test_an_int8_flow_engine_synthesizes_on_a_vnni_host_and_is_refused_elsewhere(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    options = EngineOptions(flow_precision="int8")
    if not set(INT8_DOT_FLAGS) & set(host_cpu().flags):  # this host: the one-line refusal
        with pytest.raises(ModelLoadError, match="int8 dot-product"):
            build_engine(tiny_model_dir, device="cpu", options=options, hash_cache_dir=tmp_path)
        return
    engine = build_engine(tiny_model_dir, device="cpu", options=options, hash_cache_dir=tmp_path)
    flow = engine.flow.model  # type: ignore[attr-defined]
    assert any(isinstance(m, Int8Product) for m in flow.modules())
    samples, rate = soundfile.read(tiny_model_dir / "prompt.wav", dtype="float32")
    voice = engine.extract_voice(samples, int(rate), "A prompt.")
    request = SynthesisInput(text="Hello there, a short test.", prompt=voice, seed=3)
    whole = engine.synthesize(request).samples
    chunks: list[np.ndarray] = []
    streamed = engine.synthesize_streaming(request, chunks.append).samples  # the stream's path
    assert whole.size > 0 and np.isfinite(whole).all()
    assert len(chunks) > 1 and streamed.size > 0 and np.isfinite(streamed).all()


def test_the_worker_logs_its_flow_precision(tiny_model_dir: Path) -> None:
    settings = Settings(model_dir=tiny_model_dir, flow_precision="native")
    with capture_logs() as logs:
        assert flow_precision_for(settings, "cpu", "torch") == "native"
    (event,) = [e for e in logs if e["event"] == "flow_precision_chosen"]
    assert event["precision"] == "native" and event["setting"] == "native"
