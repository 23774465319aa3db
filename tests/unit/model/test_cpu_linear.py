"""The oneDNN-backed Linear: same keys and results as nn.Linear, plain linear when traced."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from workers.model import cpu_linear
from workers.model.cpu_linear import Linear, linear


def _pair(seed: int = 0) -> tuple[Linear, nn.Linear]:
    torch.manual_seed(seed)
    ours = Linear(48, 24)
    reference = nn.Linear(48, 24)
    reference.load_state_dict(ours.state_dict())
    return ours, reference


def test_same_state_dict_keys_as_nn_linear() -> None:
    ours, reference = _pair()
    assert list(ours.state_dict()) == list(reference.state_dict()) == ["weight", "bias"]


@pytest.mark.parametrize("shape", [(48,), (1, 48), (7, 48), (16, 48), (130, 48), (2, 9, 48)])
def test_matches_nn_linear_in_inference(shape: tuple[int, ...]) -> None:
    ours, reference = _pair()
    x = torch.randn(*shape)
    with torch.inference_mode():
        assert torch.allclose(ours(x), reference(x), atol=1e-5)
        strided = torch.randn(*shape[:-1], 96)[..., ::2]
        assert torch.allclose(ours(strided), reference(strided), atol=1e-5)
        assert torch.allclose(linear(x, reference.weight), x @ reference.weight.T, atol=1e-5)


def test_uses_onednn_only_without_autograd() -> None:
    ours, _ = _pair()
    x = torch.randn(3, 48, requires_grad=True)
    assert not cpu_linear._use_onednn(x, ours.weight)
    ours(x).sum().backward()  # falls back to F.linear, so gradients work
    assert x.grad is not None
    with torch.inference_mode():
        expected = cpu_linear.onednn_available()
        assert cpu_linear._use_onednn(torch.randn(3, 48), ours.weight) == expected


@pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.trace:FutureWarning")
def test_traced_graph_holds_a_plain_linear() -> None:
    """Converters (Core ML) must see aten::linear, never the private oneDNN op."""
    ours, _ = _pair()
    with torch.inference_mode():
        graph = str(torch.jit.trace(ours, torch.randn(2, 48)).inlined_graph)
    assert "aten::linear" in graph
    assert "mkldnn" not in graph


def test_kernel_choice_per_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """`set_linear_kernel(..., "torch")` routes every Linear of a model to F.linear."""
    model = nn.Sequential(Linear(48, 24), nn.ReLU(), Linear(24, 8))
    calls: list[int] = []
    real = cpu_linear.linear

    def counting(*args: torch.Tensor | None) -> torch.Tensor:
        calls.append(1)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(cpu_linear, "linear", counting)
    x = torch.randn(3, 48)
    with torch.inference_mode():
        model(x)
        assert len(calls) == 2 and cpu_linear.linear_kernel(model) == "onednn"
        cpu_linear.set_linear_kernel(model, "torch")
        model(x)
    assert len(calls) == 2 and cpu_linear.linear_kernel(model) == "torch"
    with pytest.raises(ValueError, match="linear kernel must be one of"):
        cpu_linear.set_linear_kernel(model, "fast")


def test_llm_and_flow_share_one_linear() -> None:
    """The LLM's and the flow's projections are the same class (one oneDNN implementation)."""
    from workers.model.flow.config import FlowConfig  # noqa: PLC0415
    from workers.model.flow.model import CausalMaskedDiffWithXvec  # noqa: PLC0415
    from workers.model.llm.model import Qwen2LM  # noqa: PLC0415
    from workers.tools.fixtures.random_weights import full_llm_config  # noqa: PLC0415

    with torch.device("meta"):
        models = (CausalMaskedDiffWithXvec(FlowConfig()), Qwen2LM(full_llm_config()))
    for model in models:
        plain = [name for name, m in model.named_modules() if type(m) is nn.Linear]
        assert not plain, plain[:3]  # a bare nn.Linear would miss the oneDNN path
        assert any(isinstance(m, Linear) for m in model.modules())


needs_bf16_packing = pytest.mark.skipif(
    not cpu_linear.bf16_packing_available(),
    reason="this CPU runs no native bf16 in oneDNN (no AVX512-BF16 or AMX): nothing is packed",
)


def _bf16_pair() -> tuple[Linear, torch.Tensor]:
    torch.manual_seed(1)
    layer = Linear(48, 24).bfloat16().requires_grad_(False)
    return layer, layer.weight.detach().clone()


@needs_bf16_packing
@pytest.mark.parametrize("shape", [(48,), (1, 48), (7, 48), (16, 48), (130, 48), (2, 9, 48)])
def test_packed_bf16_weight_gives_the_plain_weights_result(shape: tuple[int, ...]) -> None:
    """Bitwise for rows (B, in): the same oneDNN product; 1-D and 3-D inputs take other
    `F.linear` paths there (bias added after rounding), so within one bf16 rounding."""
    layer, plain = _bf16_pair()
    assert cpu_linear.pack_linear_weights(layer) == 1
    assert layer.weight.is_mkldnn
    assert layer.weight.shape == plain.shape and layer.weight.dtype == torch.bfloat16
    x = torch.randn(*shape).bfloat16()
    strided = torch.randn(*shape[:-1], 96).bfloat16()[..., ::2]
    with torch.inference_mode():
        for inputs in (x, strided):
            got = layer(inputs)
            want = torch.nn.functional.linear(inputs, plain, layer.bias)
            exact = torch.nn.functional.linear(inputs.float(), plain.float(), layer.bias.float())
            if len(shape) == 2:
                assert torch.equal(got, want)
            torch.testing.assert_close(got.float(), exact, rtol=1.6e-2, atol=1e-2)
    assert torch.equal(layer.weight.to_dense(), plain)


@needs_bf16_packing
def test_torch_kernel_unpacks_and_a_second_pack_is_a_no_op() -> None:
    layer, plain = _bf16_pair()
    cpu_linear.pack_linear_weights(layer)
    assert cpu_linear.pack_linear_weights(layer) == 0  # already packed
    cpu_linear.set_linear_kernel(layer, "torch")
    assert not layer.weight.is_mkldnn and torch.equal(layer.weight, plain)
    assert cpu_linear.pack_linear_weights(layer) == 0  # "torch" layers stay plain


def test_fp32_weights_and_hosts_without_native_bf16_stay_plain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fp32 = Linear(48, 24)
    assert cpu_linear.pack_linear_weights(fp32) == 0 and not fp32.weight.is_mkldnn
    layer, _ = _bf16_pair()
    monkeypatch.setattr(cpu_linear, "bf16_packing_available", lambda: False)
    assert cpu_linear.pack_linear_weights(layer) == 0 and not layer.weight.is_mkldnn


@pytest.mark.parametrize("bias", [False, True])
def test_gemv_rows_get_the_same_bits_whatever_rows_come_with_them(bias: bool) -> None:
    """The "gemv" kernel (plain bf16 weight as the left operand): one row, a batch of rows and
    a prefill's many rows each give a row the same bits (a batched decode step is the alone
    one), within bf16 rounding of fp32."""
    torch.manual_seed(3)
    layer = Linear(64, 40, bias=bias).bfloat16().requires_grad_(False)
    if bias:
        torch.nn.init.normal_(layer.bias)
    cpu_linear.set_linear_kernel(layer, "gemv")
    assert not layer.weight.is_mkldnn
    rows = torch.randn(40, 64).bfloat16()
    with torch.inference_mode():
        every = layer(rows)
        exact = torch.nn.functional.linear(rows.float(), layer.weight.float())
        if bias:
            exact = exact + layer.bias.float()
        torch.testing.assert_close(every.float(), exact, rtol=1.6e-2, atol=2e-2)
        for count in (1, 3, 16):
            assert torch.equal(layer(rows[:count]), every[:count])
            assert torch.equal(layer(rows[:count].unsqueeze(0))[0], every[:count])
        assert torch.equal(layer(rows[5]), every[5])  # a 1-D input


def test_the_llm_decodes_with_gemv_only_in_bf16_on_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    for amx in (False, True):
        monkeypatch.setattr(cpu_linear, "has_amx_tiles", lambda a=amx: a)
        want = "gemv" if amx and cpu_linear.bf16_packing_available() else None
        got = cpu_linear.llm_linear_kernel(cpu, torch.bfloat16)
        assert got == (want or cpu_linear.default_linear_kernel(cpu, torch.bfloat16))
        assert cpu_linear.llm_linear_kernel(cpu, torch.float32) == "onednn" or not (
            cpu_linear.onednn_available()
        )


@pytest.mark.parametrize("amx", [False, True])
def test_one_fp32_row_goes_through_mv_only_on_amx_hosts(
    monkeypatch: pytest.MonkeyPatch, amx: bool
) -> None:
    """On AMX hosts one fp32 row of a "onednn" layer is `torch.mv` (bias added after), more
    rows stay on oneDNN; elsewhere every row count is oneDNN. Either way `F.linear`'s values."""
    monkeypatch.setattr(cpu_linear, "has_amx_tiles", lambda: amx)
    ours, reference = _pair()
    calls: list[int] = []
    mv = torch.mv

    def spy(weight: torch.Tensor, row: torch.Tensor) -> torch.Tensor:
        calls.append(row.numel())
        return mv(weight, row)

    monkeypatch.setattr(cpu_linear.torch, "mv", spy)
    with torch.inference_mode():
        for shape in [(48,), (1, 48), (1, 1, 48), (2, 48), (3, 1, 48)]:
            x = torch.randn(*shape)
            torch.testing.assert_close(ours(x), reference(x), rtol=1e-5, atol=1e-5)
    wanted = cpu_linear.onednn_available() and amx
    assert calls == ([48, 48, 48] if wanted else [])


@needs_bf16_packing
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gelu_as_the_packed_products_post_op(approximate: str) -> None:
    """One oneDNN product with the GELU on its accumulator: within a bf16 rounding of the two
    ops, and no further from fp64; a plain weight runs exactly the two ops."""
    layer, plain = _bf16_pair()
    x = torch.randn(130, 48).bfloat16()
    with torch.inference_mode():
        two_ops = torch.nn.functional.gelu(layer(x), approximate=approximate)
        assert torch.equal(cpu_linear.linear_gelu(layer, x, approximate), two_ops)
        cpu_linear.pack_linear_weights(layer)
        fused = cpu_linear.linear_gelu(layer, x, approximate)
    exact = torch.nn.functional.gelu(
        x.double() @ plain.double().T + layer.bias.double(), approximate=approximate
    )
    torch.testing.assert_close(fused.float(), two_ops.float(), rtol=1.6e-2, atol=1e-2)
    assert (fused.double() - exact).abs().mean() <= (two_ops.double() - exact).abs().mean()
