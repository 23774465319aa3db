"""bf16 self-attention for the flow's estimator on CPU: two batched products and an fp32
softmax, in blocks of queries.

PyTorch's CPU `scaled_dot_product_attention` (its flash kernel) was 35-39% of a bf16 flow pass.
Done as `bmm`, softmax, `bmm`, the full-size estimator's forward (2 rows, 300 frames, random
weights, AMD EPYC Zen 4, 2 threads, six interleaved passes each) took a median 590 ms against
680 ms. The arithmetic keeps the kernel's precision: scores and softmax in fp32, probabilities
cast to bf16 for the second product (as the kernel does); the output's SNR against fp64 is
45.7 dB against the kernel's 46.2 (probe at 16 heads x 350 frames). In fp32 the two ran equal,
so fp32 keeps the kernel (and check-reference its exact path).

Scores are made a block of queries at a time so no block holds more than
`score_block_bytes` (a setting of the estimator's config): a long piece in a wide batch
would otherwise hold B x H x T x T floats at once. Anywhere else (fp32, fp16, MPS, CUDA,
tracing for Core ML, autograd) this is `scaled_dot_product_attention` itself.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

BLOCKED_DTYPES = (torch.bfloat16,)
SCORE_BYTES = 4  # scores are fp32 whatever the inputs' dtype
ATTENTION_RANGE = "cosyq::cpu_attention"  # profiler range: the bench counts its ops as attention


def _use_blocked(q: Tensor, k: Tensor, v: Tensor) -> bool:
    return (
        q.device.type == "cpu"
        and q.dtype in BLOCKED_DTYPES
        and q.dtype == k.dtype == v.dtype
        and not torch.jit.is_tracing()
        and not torch.jit.is_scripting()
        and not torch.compiler.is_compiling()
        and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
    )


def attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, *, score_block_bytes: int
) -> Tensor:
    """q (B, H, Lq, D), k/v (B, H, Lk, D), bool mask (True = attend) broadcastable to
    (B, H, Lq, Lk) or None -> (B, H, Lq, D): what `scaled_dot_product_attention` returns."""
    if not _use_blocked(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    with torch.profiler.record_function(ATTENTION_RANGE):
        return _blocked(q, k, v, mask, score_block_bytes)


def _blocked(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, score_block_bytes: int
) -> Tensor:
    batch, heads, lq, dim = q.shape
    lk = k.size(-2)
    if mask is not None and bool(mask.all()):
        mask = None  # no padded keys, no chunks: nothing to fill
    # one pass each: the strided bf16 views copied into contiguous fp32, then scaled in place
    queries = torch.empty(q.shape, dtype=torch.float32).copy_(q).mul_(1.0 / math.sqrt(dim))
    queries = queries.view(batch * heads, lq, dim)
    keys_t = torch.empty(k.shape, dtype=torch.float32).copy_(k).view(batch * heads, lk, dim)
    keys_t = keys_t.transpose(1, 2)
    values = v.reshape(batch * heads, lk, v.size(-1))
    per_query = batch * heads * lk * SCORE_BYTES
    block = max(1, min(lq, score_block_bytes // per_query))
    out = torch.empty(batch * heads, lq, v.size(-1), dtype=v.dtype)
    for start in range(0, lq, block):
        stop = min(lq, start + block)
        scores = torch.bmm(queries[:, start:stop], keys_t)  # (B*H, n, Lk) fp32
        if mask is not None:
            rows = mask if mask.size(-2) == 1 else mask[..., start:stop, :]
            scores.view(batch, heads, stop - start, lk).masked_fill_(~rows, -math.inf)
        torch.softmax(scores, dim=-1, out=scores)
        torch.bmm(scores.to(v.dtype), values, out=out[:, start:stop])
    return out.view(batch, heads, lq, -1)
