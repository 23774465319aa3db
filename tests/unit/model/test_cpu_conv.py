"""The packed-weight Conv1d: nn.Conv1d's keys and bits, a plain conv when traced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from workers.model import cpu_conv, cpu_linear
from workers.model.cpu_conv import Conv1d, conv1d, pack_conv_weights
from workers.model.loader import load_model

needs_conv_packing = pytest.mark.skipif(
    not cpu_conv.conv_packing_pays(),
    reason="packed bf16 convolutions give F.conv1d's bits, for every module, only on CPUs with "
    "AMX tiles (this one has none): elsewhere only modules whose rows run alone pack, which "
    "the tests marked needs_native_bf16 check",
)

needs_native_bf16 = pytest.mark.skipif(
    not cpu_linear.bf16_packing_available(),
    reason="packed bf16 convolutions need a CPU with native bf16 (AVX512-BF16 or AMX)",
)


# (in, out, kernel, stride, padding, dilation): the flow's causal k3 and 1x1, HiFT's dilated
# resblock convs and its strided source downsampling
SHAPES = [
    (32, 16, 3, 1, 0, 1),
    (32, 16, 1, 1, 0, 1),
    (16, 16, 7, 1, 9, 3),
    (9, 16, 10, 5, 2, 1),
]


def _bf16_conv(shape: tuple[int, ...], seed: int = 0) -> tuple[Conv1d, torch.Tensor]:
    cin, cout, kernel, stride, padding, dilation = shape
    torch.manual_seed(seed)
    conv = Conv1d(cin, cout, kernel, stride, padding, dilation).bfloat16().requires_grad_(False)
    return conv, conv.weight.detach().clone()


def test_same_state_dict_keys_as_nn_conv1d() -> None:
    assert list(Conv1d(4, 3, 3).state_dict()) == list(nn.Conv1d(4, 3, 3).state_dict())


@needs_conv_packing
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(("rows", "frames"), [(1, 1), (1, 37), (2, 300), (16, 411)])
def test_packed_weight_gives_nn_conv1ds_bits(
    shape: tuple[int, ...], rows: int, frames: int
) -> None:
    conv, plain = _bf16_conv(shape)
    assert pack_conv_weights(conv) == 1
    assert conv.weight.is_mkldnn and conv.weight.dtype == torch.bfloat16
    cin, _, kernel, stride, padding, dilation = shape
    frames = max(frames, dilation * (kernel - 1) + 1 - 2 * padding)
    x = torch.randn(rows, cin, frames).bfloat16()
    transposed = torch.randn(rows, frames, cin).bfloat16().transpose(1, 2)
    with torch.inference_mode():
        for inputs in (x, transposed):
            want = F.conv1d(inputs, plain, conv.bias, stride, padding, dilation)
            assert torch.equal(conv(inputs), want)
            assert torch.equal(conv1d(conv, inputs), want)
            alone = torch.cat([conv(inputs[row : row + 1]) for row in range(rows)])
            assert torch.equal(alone, want)  # a row's bits do not depend on the batch


@needs_conv_packing
def test_a_second_pack_is_a_no_op_and_fp32_or_plain_convs_stay_plain() -> None:
    conv, _ = _bf16_conv(SHAPES[0])
    assert pack_conv_weights(conv) == 1
    assert pack_conv_weights(conv) == 0
    fp32 = Conv1d(4, 3, 3)
    assert pack_conv_weights(fp32) == 0 and not fp32.weight.is_mkldnn
    torch_conv = nn.Conv1d(4, 3, 3).bfloat16()
    assert pack_conv_weights(torch_conv) == 0 and not torch_conv.weight.is_mkldnn
    reflect = Conv1d(4, 3, 3, padding=1, padding_mode="reflect").bfloat16()
    assert pack_conv_weights(reflect) == 0


@pytest.mark.parametrize("amx", [False, True])
@pytest.mark.parametrize("native_bf16", [False, True])
def test_packing_pays_with_amx_for_any_module_without_it_only_where_rows_run_alone(
    monkeypatch: pytest.MonkeyPatch, amx: bool, native_bf16: bool
) -> None:
    """The decision alone, on any host (packing itself needs real native bf16, below)."""
    monkeypatch.setattr(cpu_conv, "has_amx_tiles", lambda: amx)
    monkeypatch.setattr(cpu_linear, "bf16_packing_available", lambda: native_bf16)
    assert cpu_conv.conv_packing_pays() is (native_bf16 and amx)
    assert cpu_conv.conv_packing_pays(rows_alone=True) is native_bf16


@pytest.mark.parametrize(
    ("amx", "native_bf16"),
    # packing really runs in the first case: oneDNN refuses a bf16 reorder without native bf16
    [pytest.param(False, True, marks=needs_native_bf16), (True, False)],
)
def test_hosts_without_amx_or_native_bf16_keep_plain_weights(
    monkeypatch: pytest.MonkeyPatch, amx: bool, native_bf16: bool
) -> None:
    conv, _ = _bf16_conv(SHAPES[0])
    monkeypatch.setattr(cpu_conv, "has_amx_tiles", lambda: amx)
    monkeypatch.setattr(cpu_linear, "bf16_packing_available", lambda: native_bf16)
    assert pack_conv_weights(conv) == 0 and not conv.weight.is_mkldnn
    # a module whose rows run alone packs without AMX, never without native bf16
    assert pack_conv_weights(conv, rows_alone=True) == int(native_bf16)
    assert conv.weight.is_mkldnn is native_bf16


@needs_native_bf16
@pytest.mark.parametrize("shape", SHAPES[:2])
@pytest.mark.parametrize(("rows", "frames"), [(1, 1), (2, 102), (2, 300), (16, 411)])
def test_packed_flow_convs_round_like_plain_ones_and_a_row_alone_as_in_a_batch(
    shape: tuple[int, ...], rows: int, frames: int
) -> None:
    """The flow's causal k3 and 1x1 convs packed where rows run alone (any native-bf16 CPU):
    within bf16 rounding of the exact product, as the plain weight is, and a row's bits the
    same alone as in a batch (so a later batched flow could not tell them apart)."""
    conv, plain = _bf16_conv(shape)
    assert pack_conv_weights(conv, rows_alone=True) == 1
    cin, kernel = shape[0], shape[2]
    x = torch.randn(rows, cin, max(frames, kernel)).bfloat16()
    with torch.inference_mode():
        exact = F.conv1d(x.double(), plain.double(), conv.bias.double())
        got, want = conv(x), F.conv1d(x, plain, conv.bias)
        got_error = (got.double() - exact).abs().max().item()
        plain_error = (want.double() - exact).abs().max().item()
        assert got_error <= 2 * plain_error + 1e-6, (got_error, plain_error)
        alone = torch.cat([conv(x[row : row + 1]) for row in range(rows)])
        assert torch.equal(alone, got)


@needs_native_bf16
def test_without_amx_a_loaded_bf16_model_packs_the_flows_convs_not_the_vocoders(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An AVX512-BF16 host: the flow (each piece alone in bf16) packs, HiFT stays plain; the
    mel within bf16 rounding of the plain weights' mel."""
    monkeypatch.setattr(cpu_conv, "has_amx_tiles", lambda: False)
    loaded = load_model(tiny_model_dir, dtype=torch.bfloat16)
    assert loaded.flow is not None and loaded.hift is not None
    estimator = [m for m in loaded.flow.decoder.estimator.modules() if isinstance(m, Conv1d)]
    assert estimator and all(m.weight.is_mkldnn for m in estimator)
    assert not any(m.weight.is_mkldnn for m in loaded.hift.modules() if isinstance(m, Conv1d))

    plain = load_model(tiny_model_dir, dtype=torch.bfloat16)
    assert plain.flow is not None
    _unpack(plain.flow)
    inputs = _flow_inputs(loaded.flow.config)
    with torch.inference_mode():
        mel, _ = loaded.flow.inference(*inputs)
        want, _ = plain.flow.inference(*inputs)
    assert _snr_db(want, mel) > 30


def _snr_db(want: torch.Tensor, got: torch.Tensor) -> float:
    want, got = want.double(), got.double()
    return float(10 * torch.log10(want.pow(2).sum() / (got - want).pow(2).sum().clamp_min(1e-30)))


@needs_native_bf16
@pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.trace:FutureWarning")
def test_traced_graph_holds_a_plain_convolution() -> None:
    """Converters (Core ML) must see aten convolution, never the private oneDNN op."""
    conv, plain = _bf16_conv(SHAPES[0])
    assert pack_conv_weights(conv, rows_alone=True) == 1
    x = torch.randn(1, 32, 20).bfloat16()
    with torch.inference_mode():
        traced = torch.jit.trace(conv, x)
        graph = str(traced.inlined_graph)
        assert torch.equal(traced(x), F.conv1d(x, plain, conv.bias))
    assert "_convolution" in graph
    assert "mkldnn" not in graph


def test_fp32_forward_is_nn_conv1ds() -> None:
    torch.manual_seed(0)
    ours, reference = Conv1d(8, 4, 3, padding=1), nn.Conv1d(8, 4, 3, padding=1)
    reference.load_state_dict(ours.state_dict())
    x = torch.randn(2, 8, 30)
    with torch.inference_mode():
        assert torch.equal(ours(x), reference(x))
    assert cpu_conv.pack_conv_weights(ours) == 0


def _flow_inputs(config: Any) -> tuple[torch.Tensor, ...]:
    """A small request for a tiny flow: 12 speech tokens, 6 prompt tokens, their mel, a speaker."""
    g = torch.Generator().manual_seed(0)
    token = torch.randint(0, 50, (1, 12), generator=g)
    prompt = torch.randint(0, 50, (1, 6), generator=g)
    feat = torch.randn(1, 2 * 6, config.mel_bins, generator=g)
    speaker = torch.randn(1, config.spk_embed_dim, generator=g)
    return token, prompt, feat, speaker


def _unpack(module: nn.Module) -> None:
    for sub in module.modules():
        if isinstance(sub, Conv1d) and sub.weight.is_mkldnn:
            sub.weight = nn.Parameter(sub.weight.to_dense().squeeze(2), requires_grad=False)


@needs_conv_packing
def test_a_loaded_bf16_model_packs_the_estimators_and_vocoders_convs_with_the_same_bits(
    tiny_model_dir: Path,
) -> None:
    """Every estimator conv and every bf16 vocoder conv packed (HiFT's fp32 F0 predictor stays
    plain); the flow's mel and the waveform equal those of the same model with plain weights."""
    loaded = load_model(tiny_model_dir, dtype=torch.bfloat16)
    assert loaded.flow is not None and loaded.hift is not None
    estimator = [m for m in loaded.flow.decoder.estimator.modules() if isinstance(m, Conv1d)]
    assert estimator and all(m.weight.is_mkldnn for m in estimator)
    vocoder = [m for m in loaded.hift.modules() if isinstance(m, Conv1d)]
    assert any(m.weight.is_mkldnn for m in vocoder)
    assert all(m.weight.is_mkldnn is (m.weight.dtype == torch.bfloat16) for m in vocoder)
    assert not any(p.is_mkldnn for p in loaded.hift.f0_predictor.parameters())

    plain = load_model(tiny_model_dir, dtype=torch.bfloat16)
    assert plain.flow is not None and plain.hift is not None
    _unpack(plain.flow)
    _unpack(plain.hift)
    inputs = _flow_inputs(loaded.flow.config)
    with torch.inference_mode():
        mel, _ = loaded.flow.inference(*inputs)
        want, _ = plain.flow.inference(*inputs)
        assert torch.equal(mel, want)
        wav = loaded.hift.inference(mel.float(), generator=torch.Generator().manual_seed(1)).wav
        same = plain.hift.inference(mel.float(), generator=torch.Generator().manual_seed(1)).wav
        assert torch.equal(wav, same)


def test_an_fp32_model_keeps_plain_convs(tiny_model_dir: Path) -> None:
    loaded = load_model(tiny_model_dir, dtype=torch.float32)
    assert loaded.flow is not None and loaded.hift is not None
    convs = [
        m for part in (loaded.flow, loaded.hift) for m in part.modules() if isinstance(m, Conv1d)
    ]
    assert convs and not any(m.weight.is_mkldnn for m in convs)
