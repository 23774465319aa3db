"""The flow stage for many requests at once: one padded batch with length masks.

Why: on a GPU or the ANE the conformer encoder and the CFM estimator run B requests in about
the time of one. Each row is the alone call's input, right-padded to the longest row:
- its own prompt tokens + speech tokens, its own prompt mel as the condition, its own speaker;
- the first frames of the fixed noise buffer, exactly the slice it gets alone;
- the encoder sees zeros past the row's end (as the alone look-ahead does) and attention keys
  past it are masked; the estimator masks them too, and CFG doubles the batch to 2B rows;
- each row's mel comes back trimmed to its own frames, prompt frames excluded.
Outputs equal the alone ones up to matmul rounding (tests bound them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from workers.model.flow.model import CausalMaskedDiffWithXvec


@dataclass(frozen=True)
class FlowRow:
    """One request's flow inputs, shaped as `CausalMaskedDiffWithXvec.inference` takes them."""

    token: Tensor  # (1, N) speech tokens
    prompt_token: Tensor  # (1, P)
    prompt_feat: Tensor  # (1, 2P, 80)
    embedding: Tensor  # (1, 192)


@torch.inference_mode()
def batched_inference(
    flow: CausalMaskedDiffWithXvec,
    rows: Sequence[FlowRow],
    *,
    between_steps: Callable[[], None] | None = None,
) -> list[Tensor]:
    """Mel (80, 2N_i) float32 per row, prompt frames excluded; validated per row as alone.

    `between_steps` runs between the Euler steps (`ConditionalFlowMatching.solve`)."""
    for row in rows:
        flow._check_inputs(row.token, row.prompt_token, row.prompt_feat, row.embedding)
        flow._check_length(row.token.size(1) + row.prompt_token.size(1), row.token.size(1), True)
    ratio, bins = flow.config.token_mel_ratio, flow.config.mel_bins
    device = flow.input_embedding.weight.device
    ids = [torch.cat([r.prompt_token, r.token.to(r.prompt_token.dtype)], dim=1)[0] for r in rows]
    lengths = torch.tensor([t.numel() for t in ids], device=device)
    tokens = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True).to(device)
    spks = flow.project_speaker(torch.cat([r.embedding for r in rows]).to(device))
    h = flow.embed_tokens(tokens, lengths)
    mu = flow.encoder_proj(flow.encoder(h, None, False, lengths))  # (B, T, 80)
    frames = mu.size(1)
    frame_lengths = [ratio * t.numel() for t in ids]
    mask = torch.zeros(len(rows), 1, frames, device=device, dtype=mu.dtype)
    cond = mu.new_zeros(len(rows), bins, frames)
    noise = mu.new_zeros(len(rows), bins, frames)
    for b, (row, n) in enumerate(zip(rows, frame_lengths, strict=True)):
        mask[b, :, :n] = 1
        prompt = row.prompt_feat[0].to(device, mu.dtype)  # (2P, 80)
        cond[b, :, : prompt.size(0)] = prompt.transpose(0, 1)
        noise[b, :, :n] = flow.decoder.noise(n)[0].to(device, mu.dtype)
    mel = flow.decoder.solve(  # padding: zeros
        noise, mu.transpose(1, 2), mask, spks, cond, between_steps=between_steps
    )
    return [
        mel[b, :, ratio * row.prompt_token.size(1) : n].float()
        for b, (row, n) in enumerate(zip(rows, frame_lengths, strict=True))
    ]
