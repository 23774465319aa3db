"""The CPU attention in blocks gives what `scaled_dot_product_attention` gives, masks included."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from workers.model import cpu_attention, cpu_isa
from workers.model.cpu_attention import KeyLimits, attention, attention_over
from workers.model.flow.encoder import chunk_mask
from workers.model.flow.stream_layers import Span, key_limits, visible_keys

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


def _snr_db(reference: torch.Tensor, got: torch.Tensor) -> float:
    reference, got = reference.double(), got.double()
    return float(10 * torch.log10(reference.pow(2).sum() / (reference - got).pow(2).sum()))


@pytest.mark.parametrize("mask_name", ["none", "padded keys", "chunks and padding"])
def test_bf16_attention_stays_close_to_fp32(mask_name: str, bf16_attention_kernel: str) -> None:
    """bf16 scores: within 6 dB of the fused kernel's error against fp32, and well above
    what the bf16 products around attention keep (~30 dB at the estimator's output)."""
    q, k, v = _inputs(torch.bfloat16)
    mask = _masks(LQ)[mask_name]
    exact = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
    got = attention(q, k, v, mask, score_block_bytes=1 << 20)
    fused = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert got.dtype == torch.bfloat16
    assert _snr_db(exact, got.float()) >= _snr_db(exact, fused.float()) - 6.0
    assert _snr_db(exact, got.float()) >= 40.0


def test_bf16_estimator_is_as_close_to_fp32_with_blocked_attention(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the precision of the scores is for: a bf16 estimator's output against the fp32
    estimator's is as close with the blocked attention as with the fused kernel (blocked
    forced, so an AMX host, which picks the fused one, tests it too)."""
    monkeypatch.setattr(cpu_attention, "blocked_attention_pays", lambda: True)
    from workers.model.flow import estimator as estimator_module  # noqa: PLC0415
    from workers.model.flow.config import EstimatorConfig  # noqa: PLC0415
    from workers.model.flow.estimator import CausalConditionalDecoder  # noqa: PLC0415

    config = EstimatorConfig(channels=128, attention_head_dim=64, num_heads=2, num_mid_blocks=2)
    torch.manual_seed(0)
    fp32 = CausalConditionalDecoder(config).eval()
    bf16 = CausalConditionalDecoder(config).eval()
    bf16.load_state_dict(fp32.state_dict())
    bf16 = bf16.bfloat16()
    g = torch.Generator().manual_seed(1)
    frames = 120
    x, mu, cond = (torch.randn(2, 80, frames, generator=g) for _ in range(3))
    inputs = (x, torch.ones(2, 1, frames), mu, torch.tensor([0.4, 0.4]), torch.randn(2, 80), cond)
    with torch.inference_mode():
        reference = fp32(*inputs)
        blocked = bf16(*(t.bfloat16() for t in inputs)).float()
        for module in bf16.modules():  # the kernel policy's switch off the CPU: the fused kernel
            if isinstance(module, estimator_module.SelfAttention):
                module.blocked_attention = False
        fused = bf16(*(t.bfloat16() for t in inputs)).float()
    assert _snr_db(reference, blocked) >= _snr_db(reference, fused) - 1.0


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


@pytest.mark.parametrize(
    ("start", "new", "chunk"), [(0, 37, 10), (20, 17, 10), (40, 23, 50), (7, 30, 4)]
)
@pytest.mark.parametrize("block_bytes", [1, 4 * B * H * 60 * 5, 1 << 30])
def test_key_limits_hide_what_the_chunk_mask_hides(
    start: int, new: int, chunk: int, block_bytes: int
) -> None:
    """A streamed pass's chunk mask as runs of rows (`key_limits`): the same mask as
    `visible_keys`, and the blocked attention over it gives what the fused kernel gives
    over the bool mask, in every block split."""
    span = Span(start, start + new, 0)
    limits = key_limits(span, chunk)
    dense = visible_keys(span, chunk, device=torch.device("cpu"))
    assert limits is not None and dense is not None
    assert torch.equal(limits.dense(), dense)
    g = torch.Generator().manual_seed(1)
    q = torch.randn(B, H, new, D, generator=g)
    k, v = (torch.randn(B, H, span.end, D, generator=g) for _ in range(2))
    got = cpu_attention._blocked(q, k, v, limits, block_bytes)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    fused = attention(q, k, v, limits, score_block_bytes=block_bytes)  # fp32: the kernel
    torch.testing.assert_close(fused, want, rtol=1e-5, atol=1e-5)


def test_key_limits_that_hide_nothing_and_a_wrong_key_count() -> None:
    assert key_limits(Span(0, 10, 0), 0) is None  # chunk 0: full attention
    limits = key_limits(Span(10, 20, 0), 10)  # one whole chunk: sees every key
    assert limits is not None and not limits.hides_any
    q, k, v = _inputs(torch.bfloat16, lk=LQ)
    wrong = KeyLimits(((0, LQ, 5),), LQ + 1)
    with pytest.raises(ValueError, match="key limits over"):
        attention(q, k, v, wrong, score_block_bytes=1 << 30)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("cuts", [[20], [7, 30], [0, 57]])
def test_attention_over_segments_equals_attention_over_the_joined_keys(
    dtype: torch.dtype, cuts: list[int], bf16_attention_kernel: str
) -> None:
    """A primed voice's kept keys read where they are: the same as one joined segment (fp32
    to rounding; bf16 as close to fp32 as the joined keys are), masks and blocks included."""
    lk = 57
    span = Span(lk - LQ, lk, 0)
    limits = key_limits(span, 10)
    q, k, v = _inputs(dtype, lk=lk)
    edges = [0, *cuts, lk]
    segments = [(k[:, :, a:b], v[:, :, a:b]) for a, b in itertools.pairwise(edges)]
    got = attention_over(q, segments, limits, score_block_bytes=4 * B * H * lk * 5)
    joined = attention(q, k, v, limits, score_block_bytes=1 << 30)
    exact = F.scaled_dot_product_attention(
        *(t.float() for t in (q, k, v)), attn_mask=limits.dense()
    )
    if dtype == torch.float32:
        torch.testing.assert_close(got, joined, rtol=1e-5, atol=1e-5)
    else:
        assert _snr_db(exact, got.float()) >= _snr_db(exact, joined.float()) - 3


@pytest.mark.parametrize("lengths", [[30, 12], [0, 25, 9], [40]])
def test_segment_scores_written_in_place_equal_the_joined_products(lengths: list[int]) -> None:
    """Each segment's score product written into its columns of one buffer: the same bits as
    joining the products, keys given as the transposed views a key cache holds."""
    torch.manual_seed(3)
    rows = torch.randn(B * H, LQ, D).bfloat16()
    keys_t = [torch.randn(B * H, n + 4, D).bfloat16()[:, :n].transpose(1, 2) for n in lengths]
    want = torch.cat([torch.bmm(rows, keys) for keys in keys_t], dim=-1)
    got = cpu_attention._joined_scores(rows, keys_t, sum(lengths))
    assert got.is_contiguous()
    assert torch.equal(got, want)


def test_amx_hosts_pick_the_fused_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's choice comes from PyTorch's AMX probe; a torch without it keeps blocked."""
    for has_amx, pays in ((True, False), (False, True)):
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda h=has_amx: h)
        _clear_host_probes()
        assert cpu_attention.blocked_attention_pays() is pays
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    _clear_host_probes()
    assert cpu_attention.blocked_attention_pays() is True
    monkeypatch.undo()
    _clear_host_probes()


def _clear_host_probes() -> None:
    cpu_isa.has_amx_tiles.cache_clear()
    cpu_attention.blocked_attention_pays.cache_clear()


def test_the_fused_choice_runs_the_fused_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the fused kernel is picked, bf16 attention (chunk limits, segments) is exactly
    `scaled_dot_product_attention` over the joined keys with the limits as a dense mask."""
    monkeypatch.setattr(cpu_attention, "blocked_attention_pays", lambda: False)
    lk = 57
    limits = key_limits(Span(lk - LQ, lk, 0), 10)
    assert limits is not None and limits.hides_any
    q, k, v = _inputs(torch.bfloat16, lk=lk)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=limits.dense())
    segments = [(k[:, :, :20], v[:, :, :20]), (k[:, :, 20:], v[:, :, 20:])]
    assert torch.equal(attention(q, k, v, limits, score_block_bytes=1), want)
    assert torch.equal(attention_over(q, segments, limits, score_block_bytes=1), want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_mask_that_hides_nothing_reaches_the_fused_kernel_as_none(
    monkeypatch: pytest.MonkeyPatch, dtype: torch.dtype
) -> None:
    """An all-true mask is dropped before the fused kernel (same bits, no mask to add); one
    that hides a key is passed on."""
    monkeypatch.setattr(cpu_attention, "blocked_attention_pays", lambda: False)
    q, k, v = _inputs(dtype)
    masks = _masks(LQ)
    with_mask = F.scaled_dot_product_attention(q, k, v, attn_mask=masks["all true"])
    padded = F.scaled_dot_product_attention(q, k, v, attn_mask=masks["padded keys"])
    seen: list[torch.Tensor | None] = []
    fused = F.scaled_dot_product_attention

    def spy(*args: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        seen.append(attn_mask)
        return fused(*args, attn_mask=attn_mask)

    monkeypatch.setattr(cpu_attention.F, "scaled_dot_product_attention", spy)
    with torch.inference_mode():
        assert torch.equal(attention(q, k, v, masks["all true"], score_block_bytes=1), with_mask)
        assert torch.equal(attention(q, k, v, masks["padded keys"], score_block_bytes=1), padded)
    assert seen[0] is None
    assert seen[1] is masks["padded keys"]
