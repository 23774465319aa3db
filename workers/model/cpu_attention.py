"""bf16 self-attention for the flow's estimator on CPU: two bf16 batched products and a
softmax, in blocks of queries.

PyTorch's CPU `scaled_dot_product_attention` (its flash kernel) was 35-39% of a bf16 flow pass.
Here the scores are one bf16 `bmm` (fp32 accumulation inside, rounded to bf16 once), the
softmax runs in place on them (computed in fp32, written back in bf16) and the probabilities
go straight into the second `bmm`: no fp32 copies of the queries, keys or scores. Full-size
estimator forward (2 rows x 300 frames, random weights, AMD EPYC Zen 4, 2 threads, eight
interleaved passes each): median 418 ms against 473 ms with fp32 scores, 584 ms with the
flash kernel. Rounding the scores to bf16 is the one precision change: the attention's own
output is ~5 dB further from fp64 (47 against 53 dB), but the estimator's output is as close
to the fp32 estimator's as before (30.3 against 30.2 dB SNR; the bf16 products around it set
that figure), and `cosyq-worker bench --compare-fp32` prints the SNR per stage. fp32 keeps
the fused kernel (and check-reference its exact path).

A chunk mask over a streamed pass's new queries comes as `KeyLimits` (each chunk's queries see
a prefix of the keys): only the hidden tail of each chunk's rows is filled, and nothing is
checked per call (a bool mask's fill and all() were ~0.1 s of a 1.1 s first-chunk flow pass).

On a CPU with AMX tiles the fused kernel wins instead (`blocked_attention_pays`): PyTorch's
flash kernel runs its bf16 products as AMX brgemm there. Intel Xeon with AMX (family 6 model
207), 2 threads, interleaved calls: 2 rows x 8 heads x 300 frames 1.62 against 3.11 ms, a
16-request batch (32 rows) 22.3 against 53.7 ms, a streamed pass's 100 queries over 400 keys
0.59 against 0.81 ms (0.66 with a primed voice's two key segments joined per call), and closer
to fp64 (53 against 47 dB). A primed voice's keys stay apart in the cache either way
(`reads_segments`); the fused kernel gets them joined per call (one layer's keys, ~1 MB).

Scores are made a block of queries at a time so no block holds more than
`score_block_bytes` (a setting of the estimator's config): a long piece in a wide batch
would otherwise hold B x H x T x T scores at once. Anywhere else (fp32, fp16, MPS, CUDA,
tracing for Core ML, autograd) this is `scaled_dot_product_attention` itself.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from workers.model.cpu_isa import has_amx_tiles
from workers.model.cpu_linear import cpu_inference

BLOCKED_DTYPES = (torch.bfloat16,)
ATTENTION_RANGE = "cosyq::cpu_attention"  # profiler range: the bench counts its ops as attention


@dataclass(frozen=True)
class KeyLimits:
    """Queries in runs, each seeing a prefix of the keys: rows start..stop see keys < visible
    (runs in row order, covering every row once); `keys` is the key count."""

    runs: tuple[tuple[int, int, int], ...]
    keys: int

    @property
    def hides_any(self) -> bool:
        return any(visible < self.keys for _, _, visible in self.runs)

    def dense(self, device: torch.device | str = "cpu") -> Tensor:
        """The same as a bool mask (rows, keys), True = attend."""
        rows = self.runs[-1][1] if self.runs else 0
        limit = torch.empty(rows, dtype=torch.long, device=device)
        for start, stop, visible in self.runs:
            limit[start:stop] = visible
        return torch.arange(self.keys, device=device).unsqueeze(0) < limit.unsqueeze(1)


Mask = Tensor | KeyLimits | None


class AttentionLayer(nn.Module):
    """Base of the flows' self-attention layers (CosyVoice 2's U-Net, CosyVoice 3's DiT).

    `blocked_attention`: whether the blocked bf16 kernel may run (the kernel policy turns it
    off off the CPU: `F.scaled_dot_product_attention` alone); `score_block_bytes`: the most
    one block of scores may hold (from the estimator config's `attention_score_block_mb`)."""

    blocked_attention: bool = True

    def __init__(self, score_block_mb: int) -> None:
        super().__init__()
        self.score_block_bytes = score_block_mb * 1024 * 1024

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Mask) -> Tensor:
        """`attention` under this layer's settings."""
        return attention(
            q, k, v, mask, score_block_bytes=self.score_block_bytes, blocked=self.blocked_attention
        )


@functools.cache
def blocked_attention_pays() -> bool:
    """False on CPUs with AMX tiles, where the fused flash kernel was 1.4-2.4x faster (see the
    module docstring); True elsewhere (AVX512-BF16 without AMX: blocked 418 against 584 ms a
    pass). Read once from PyTorch's own CPU probe."""
    return not has_amx_tiles()


def reads_segments(t: Tensor) -> bool:
    """Whether a cache of `t`'s dtype and device should keep a primed voice's key segments
    apart (bf16 on CPU: the blocked path reads them where they are; the fused kernel on AMX
    gets them joined per call, one layer at a time); elsewhere `attention_over` joins them
    anyway, so a cache should hold them joined once."""
    return t.device.type == "cpu" and t.dtype in BLOCKED_DTYPES


def _blocked_dtype(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """bf16 CPU tensors outside tracing and autograd: where a hand-made kernel may run."""
    return (
        q.device.type == "cpu"
        and q.dtype in BLOCKED_DTYPES
        and q.dtype == k.dtype == v.dtype
        and not torch.jit.is_tracing()
        and not torch.jit.is_scripting()
        and not torch.compiler.is_compiling()
        and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
    )


def _use_blocked(q: Tensor, k: Tensor, v: Tensor) -> bool:
    return _blocked_dtype(q, k, v) and blocked_attention_pays()


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Mask,
    *,
    score_block_bytes: int,
    blocked: bool = True,
) -> Tensor:
    """q (B, H, Lq, D), k/v (B, H, Lk, D), bool mask (True = attend) broadcastable to
    (B, H, Lq, Lk), `KeyLimits` over (Lq, Lk), or None -> (B, H, Lq, D): what
    `scaled_dot_product_attention` returns. `blocked` False (the kernel policy off the CPU):
    the fused kernel whatever the input."""
    if not (blocked and _use_blocked(q, k, v)):
        if isinstance(mask, KeyLimits):
            if mask.keys != k.size(-2):
                raise ValueError(f"attention: key limits over {mask.keys} keys, given {k.size(-2)}")
            mask = mask.dense(q.device) if mask.hides_any else None
        elif _hides_nothing(mask, q):
            mask = None  # the same bits, and the fused kernel skips adding a zero mask
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with torch.profiler.record_function(ATTENTION_RANGE):
        return _blocked(q, k, v, mask, score_block_bytes)


def attention_over(
    q: Tensor,
    segments: Sequence[tuple[Tensor, Tensor]],
    mask: Mask,
    *,
    score_block_bytes: int,
    blocked: bool = True,
) -> Tensor:
    """`attention` over keys/values given as segments of consecutive positions, in order
    (each (B, H, L_i, D)): a streamed pass of a primed voice reads the voice's kept positions
    where they are. Where the blocked path runs, two or more segments are never joined: each
    gets its own score product and its share of the weighted sum; elsewhere (fp32, whose
    fused kernel was faster over a whole piece than blocked products over segments: 11-14
    against 13-16 s per fp32 piece) they are joined first."""
    if len(segments) == 1:
        (k, v) = segments[0]
        return attention(q, k, v, mask, score_block_bytes=score_block_bytes, blocked=blocked)
    if not (blocked and all(_use_blocked(q, k, v) for k, v in segments)):
        k = torch.cat([k for k, _ in segments], dim=2)
        v = torch.cat([v for _, v in segments], dim=2)
        return attention(q, k, v, mask, score_block_bytes=score_block_bytes, blocked=blocked)
    with torch.profiler.record_function(ATTENTION_RANGE):
        return _blocked_over(q, segments, mask, score_block_bytes)


def _hides_nothing(mask: Mask, q: Tensor) -> bool:
    """A bool mask that attends everywhere (one request's non-streaming pass), on CPU outside
    tracing (a traced graph keeps its mask input). Full-size estimator call on an AMX Xeon
    (2 rows x 8 heads x 300 frames, bf16): 822 against 947 us with the all-true mask."""
    return (
        isinstance(mask, Tensor)
        and mask.dtype == torch.bool
        and cpu_inference(q, q)
        and bool(mask.all())
    )


def _blocked(q: Tensor, k: Tensor, v: Tensor, mask: Mask, score_block_bytes: int) -> Tensor:
    return _blocked_over(q, [(k, v)], mask, score_block_bytes)


def _blocked_over(
    q: Tensor, segments: Sequence[tuple[Tensor, Tensor]], mask: Mask, score_block_bytes: int
) -> Tensor:
    """Scores, softmax and the weighted sum in q's dtype, a block of queries at a time; with
    several segments, the scores are joined (not the keys) and the sum is accumulated."""
    batch, heads, lq, dim = q.shape
    lengths = [k.size(-2) for k, _ in segments]
    lk = sum(lengths)
    if isinstance(mask, KeyLimits):
        if mask.keys != lk:
            raise ValueError(f"attention: key limits over {mask.keys} keys, given {lk}")
        mask = mask if mask.hides_any else None
    elif mask is not None and bool(mask.all()):
        mask = None  # no padded keys, no chunks: nothing to fill
    # the scale is a power of two for the estimator's head sizes (64: 1/8), so exact in bf16
    queries = (q * (1.0 / math.sqrt(dim))).reshape(batch * heads, lq, dim)
    keys_t = [k.reshape(batch * heads, k.size(-2), dim).transpose(1, 2) for k, _ in segments]
    values = [v.reshape(batch * heads, v.size(-2), v.size(-1)) for _, v in segments]
    per_query = batch * heads * lk * q.element_size()
    block = max(1, min(lq, score_block_bytes // per_query))
    out = torch.empty(batch * heads, lq, values[0].size(-1), dtype=q.dtype)
    for start in range(0, lq, block):
        stop = min(lq, start + block)
        rows = queries[:, start:stop]
        if len(keys_t) == 1:
            scores = torch.bmm(rows, keys_t[0])  # (B*H, n, Lk)
        else:
            scores = _joined_scores(rows, keys_t, lk)
        if isinstance(mask, KeyLimits):
            _hide_tails(scores, mask, start, stop)
        elif mask is not None:
            hidden = mask if mask.size(-2) == 1 else mask[..., start:stop, :]
            scores.view(batch, heads, stop - start, lk).masked_fill_(~hidden, -math.inf)
        torch.softmax(scores, dim=-1, out=scores)
        block_out = out[:, start:stop]
        offset = 0
        for index, part in enumerate(values):
            n = part.size(1)
            weights = scores[:, :, offset : offset + n]
            if index == 0:
                torch.bmm(weights, part, out=block_out)
            else:
                block_out.baddbmm_(weights, part)
            offset += n
    return out.view(batch, heads, lq, -1)


def _joined_scores(rows: Tensor, keys_t: Sequence[Tensor], lk: int) -> Tensor:
    """(B*H, n, Lk): each segment's score product written into its columns of one buffer, the
    same bits as joining the products, without the join's copy (a streamed pass's 100 queries
    over a primed voice's 300 keys and its own 100, AMD EPYC Zen 4, 2 threads: 607 against
    758 us a call, 560 calls a pass)."""
    scores = rows.new_empty(rows.size(0), rows.size(1), lk)
    offset = 0
    for keys in keys_t:
        n = keys.size(-1)
        torch.bmm(rows, keys, out=scores[:, :, offset : offset + n])
        offset += n
    return scores


def _hide_tails(scores: Tensor, limits: KeyLimits, start: int, stop: int) -> None:
    """-inf on the keys each run of rows start..stop (the block's) does not see."""
    for run_start, run_stop, visible in limits.runs:
        first, last = max(run_start, start), min(run_stop, stop)
        if first < last and visible < limits.keys:
            scores[:, first - start : last - start, visible:] = -math.inf
