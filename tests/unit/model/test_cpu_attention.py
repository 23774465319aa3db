"""The CPU attention in blocks gives what `scaled_dot_product_attention` gives, masks included."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from workers.model import cpu_attention
from workers.model.cpu_attention import attention
from workers.model.flow.encoder import chunk_mask

B, H, LQ, D = 2, 3, 37, 16


def _inputs(dtype: torch.dtype, lk: int = LQ) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, LQ, D, generator=g)
    k = torch.randn(B, H, lk, D, generator=g)
    v = torch.randn(B, H, lk, D, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _masks(lk: int) -> dict[str, torch.Tensor | None]:
    padded = torch.ones(B, 1, 1, lk, dtype=torch.bool)
    padded[1, ..., lk - 9 :] = False  # the second row's last 9 keys are padding
    chunks = chunk_mask(LQ, 10, device=torch.device("cpu")).view(1, 1, LQ, LQ)
    return {
        "none": None,
        "all true": torch.ones(B, 1, 1, lk, dtype=torch.bool),
        "padded keys": padded,
        "chunks and padding": (padded & chunks) if lk == LQ else padded,
    }


@pytest.mark.parametrize("mask_name", ["none", "all true", "padded keys", "chunks and padding"])
@pytest.mark.parametrize("block_bytes", [1, 4 * B * H * LQ * 5, 1 << 30])
def test_blocked_arithmetic_equals_the_fused_kernel(mask_name: str, block_bytes: int) -> None:
    """The blocks' arithmetic, run on fp32 inputs (fp32 itself keeps the kernel)."""
    q, k, v = _inputs(torch.float32)
    mask = _masks(LQ)[mask_name]
    got = cpu_attention._blocked(q, k, v, mask, block_bytes)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_queries_against_more_keys_than_queries() -> None:
    """The streamed estimator's case: new frames' queries against kept plus new keys."""
    q, k, v = _inputs(torch.float32, lk=LQ + 20)
    mask = _masks(LQ + 20)["padded keys"]
    got = cpu_attention._blocked(q, k, v, mask, 4 * B * H * (LQ + 20) * 3)
    torch.testing.assert_close(
        got, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), rtol=1e-5, atol=1e-5
    )


def test_fp32_keeps_the_fused_kernel() -> None:
    q, k, v = _inputs(torch.float32)
    got = attention(q, k, v, None, score_block_bytes=1)
    assert torch.equal(got, F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("mask_name", ["none", "padded keys", "chunks and padding"])
def test_bf16_is_as_close_to_fp32_as_the_fused_kernel(mask_name: str) -> None:
    """Scores and softmax stay fp32: the bf16 result's error against fp32 is the kernel's."""
    q, k, v = _inputs(torch.bfloat16)
    mask = _masks(LQ)[mask_name]
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    got = attention(q, k, v, mask, score_block_bytes=1 << 20)
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert got.dtype == torch.bfloat16
    err_got = (got.float() - exact).pow(2).mean()
    err_fused = (fused.float() - exact).pow(2).mean()
    assert err_got <= 1.5 * err_fused + 1e-8


@pytest.mark.filterwarnings("ignore:`torch.jit.trace:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:`torch.jit.trace:FutureWarning")
def test_traced_attention_is_the_plain_op() -> None:
    """Core ML converts a traced graph: it must see scaled_dot_product_attention."""
    q, k, v = _inputs(torch.bfloat16)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return attention(q, k, v, None, score_block_bytes=1 << 20)

    traced = torch.jit.trace(fn, (q, k, v), check_trace=False)
    assert "scaled_dot_product_attention" in str(traced.graph)
    assert "bmm" not in str(traced.graph)
