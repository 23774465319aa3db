"""CosyVoice 3's flow stage (`CausalMaskedDiffWithDiT`): speech tokens -> 80-bin mel frames.

Stages:
1. `project_speaker`: L2-normalised 192-dim speaker vector -> 80-dim condition (as CosyVoice 2).
2. `encode`: prompt + target tokens embedded straight into 80 channels -> pre-look-ahead convs
   (kernel 4 seeing 3 tokens ahead, then causal kernel 3, residual) -> every frame repeated
   `token_mel_ratio` times: mu. There is no conformer encoder.
3. `decoder` (`FlowMatchingSolver`, CosyVoice 2's): from the fixed noise, 10 Euler steps of the
   DiT estimator with classifier-free guidance.
`inference` chains them and returns the mel frames after the prompt. With `finalize=False` the
last `pre_lookahead_len` tokens are right context only (the output is 2 x 3 frames shorter).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shared.errors import InvalidRequestError
from workers.model.checkpoint import load_strict
from workers.model.cpu_linear import Linear
from workers.model.dit.config import DiTFlowConfig
from workers.model.dit.estimator import DiT
from workers.model.embedding import Embedding
from workers.model.flow.encoder import PreLookahead
from workers.model.flow.model import EulerStep, FlowMatchingSolver, check_token_ids


class DiTFlowMatching(FlowMatchingSolver):
    """CosyVoice 3's CFM: CosyVoice 2's solver, noise and schedule around the DiT estimator."""

    estimator: DiT

    def __init__(self, config: DiTFlowConfig) -> None:
        super().__init__(config.cfm, config.mel_bins, DiT(config.estimator))


@dataclass(frozen=True)
class DiTFlowIntermediates:
    """What `inference` computed on the way, for parity checks and debugging."""

    spk_proj: Tensor  # (1, 80)
    token_embedding: Tensor  # (1, N, 80)
    prelookahead_out: Tensor  # (1, N or N - lookahead, 80)
    mu: Tensor  # (1, 80, T) channel-major
    noise: Tensor  # (1, 80, T)
    cond: Tensor  # (1, 80, T)
    steps: list[EulerStep]


class CausalMaskedDiffWithDiT(nn.Module):
    """The flow stage; attribute names match the official checkpoint's keys."""

    def __init__(self, config: DiTFlowConfig) -> None:
        super().__init__()
        self.config = config
        self.input_embedding = Embedding(config.vocab_size, config.mel_bins)
        self.spk_embed_affine_layer = Linear(config.spk_embed_dim, config.mel_bins)
        self.pre_lookahead_layer = PreLookahead(
            config.mel_bins, config.pre_lookahead_len, channels=config.pre_lookahead_channels
        )
        self.decoder = DiTFlowMatching(config)

    def project_speaker(self, embedding: Tensor) -> Tensor:
        """Speaker embedding (1, 192) -> (1, 80): L2-normalised (in float32), then affine."""
        unit = F.normalize(embedding.float(), dim=1)
        return self.spk_embed_affine_layer(unit.to(self.spk_embed_affine_layer.weight.dtype))

    def encode(self, tokens: Tensor, *, finalize: bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """Tokens (1, N) -> (embedding (1, N, 80), pre-look-ahead out (1, N', 80), mu (1, 80, T)).

        N' = N, or N - pre_lookahead_len when not finalizing; T = token_mel_ratio * N'.
        """
        embedded = self.input_embedding(torch.clamp(tokens, min=0))
        h, context = embedded, None
        if not finalize:
            keep = embedded.size(1) - self.config.pre_lookahead_len
            h, context = embedded[:, :keep], embedded[:, keep:]
        out = self.pre_lookahead_layer(h, context)
        mu = out.repeat_interleave(self.config.token_mel_ratio, dim=1).transpose(1, 2)
        return embedded, out, mu

    def inference(
        self,
        token: Tensor,
        prompt_token: Tensor,
        prompt_feat: Tensor,
        embedding: Tensor,
        *,
        streaming: bool = False,
        finalize: bool = True,
        record: list[EulerStep] | None = None,
    ) -> tuple[Tensor, DiTFlowIntermediates]:
        """Mel (1, 80, T_out) for `token` (1, N), after prompt tokens (1, P) / feat (1, 2P, 80).

        `embedding` is the (1, 192) speaker vector; the returned mel excludes the prompt frames.
        `streaming` limits the DiT's attention to static chunks; `record` collects every
        estimator call.
        """
        self._check_inputs(token, prompt_token, prompt_feat, embedding, finalize)
        spks = self.project_speaker(embedding)
        tokens = torch.cat([prompt_token, token.to(prompt_token.dtype)], dim=1)
        embedded, out, mu = self.encode(tokens, finalize=finalize)
        num_frames, prompt_frames = mu.size(-1), prompt_feat.size(1)
        cond = mu.new_zeros(1, num_frames, self.config.mel_bins)
        cond[:, :prompt_frames] = prompt_feat.to(mu.dtype)
        cond = cond.transpose(1, 2)
        mask = mu.new_ones(1, 1, num_frames)
        noise = self.decoder.noise(num_frames).to(mu.device, mu.dtype)
        mel = self.decoder.solve(noise, mu, mask, spks, cond, streaming=streaming, record=record)
        extra = DiTFlowIntermediates(spks, embedded, out, mu, noise, cond, record or [])
        return mel[:, :, prompt_frames:].float(), extra

    def _check_inputs(
        self,
        token: Tensor,
        prompt_token: Tensor,
        prompt_feat: Tensor,
        embedding: Tensor,
        finalize: bool,
    ) -> None:
        """Reject malformed requests with a message naming the field, before any compute."""
        cfg = self.config
        check_token_ids(token, prompt_token, cfg.vocab_size)
        if not finalize and token.size(1) <= cfg.pre_lookahead_len:
            raise InvalidRequestError(
                f"flow token: a non-final chunk needs more than {cfg.pre_lookahead_len} tokens "
                f"(the last {cfg.pre_lookahead_len} are look-ahead only), got {token.size(1)}"
            )
        expected = (1, cfg.token_mel_ratio * prompt_token.size(1), cfg.mel_bins)
        if tuple(prompt_feat.shape) != expected:
            raise InvalidRequestError(
                f"flow prompt_feat: expected shape {expected} ({cfg.token_mel_ratio} frames per "
                f"prompt token, time-major), got {tuple(prompt_feat.shape)}"
            )
        if tuple(embedding.shape) != (1, cfg.spk_embed_dim):
            raise InvalidRequestError(
                f"flow embedding: expected shape (1, {cfg.spk_embed_dim}), "
                f"got {tuple(embedding.shape)}"
            )
        total = prompt_token.size(1) + token.size(1) - (0 if finalize else cfg.pre_lookahead_len)
        self.decoder.check_frames(cfg.token_mel_ratio * total)


def build_dit_flow(
    config: DiTFlowConfig,
    state_dict: Mapping[str, Tensor],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    source: Path | str = "flow.pt",
) -> CausalMaskedDiffWithDiT:
    """Build on the meta device, assign the checkpoint's tensors (strict, `inv_freq` included),
    move, eval mode. Raises `ModelLoadError` naming `source` when keys or shapes differ."""
    with torch.device("meta"):
        flow = CausalMaskedDiffWithDiT(config)
    load_strict(flow, state_dict, source=source, assign=True)
    return flow.to(device=device, dtype=dtype).eval().requires_grad_(False)
