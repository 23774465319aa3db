"""CosyVoice 2's flow stage (`CausalMaskedDiffWithXvec`): speech tokens -> 80-bin mel frames.

Stages, each callable on its own so they can be timed and converted separately:
1. `project_speaker`: L2-normalised 192-dim speaker vector -> 80-dim condition.
2. `encode`: prompt + target tokens -> embeddings -> conformer encoder (x2 upsample) ->
   `encoder_proj` -> mu, one 80-dim frame per mel frame.
3. `decoder` (`ConditionalFlowMatching`): from the fixed noise, 10 Euler steps of the U-Net
   estimator with classifier-free guidance; a traceable module whose inputs are all tensors.
`inference` chains them and returns the mel frames after the prompt, as upstream does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from shared.errors import InvalidRequestError
from workers.model.checkpoint import load_strict
from workers.model.cpu_linear import Linear
from workers.model.embedding import Embedding
from workers.model.flow.config import CfmConfig, FlowConfig
from workers.model.flow.encoder import UpsampleConformerEncoder
from workers.model.flow.estimator import CausalConditionalDecoder


def make_noise(config: CfmConfig, mel_bins: int) -> Tensor:
    """The CFM's fixed noise: seed-`noise_seed` randn(1, mel_bins, noise_frames) on CPU.

    Drawn from a local generator, so the process-wide RNG is left alone (upstream reseeds it).
    """
    generator = torch.Generator(device="cpu").manual_seed(config.noise_seed)
    shape = (1, mel_bins, config.noise_frames)
    return torch.randn(shape, generator=generator, device="cpu", dtype=torch.float32)


def cosine_schedule(n_steps: int, *, like: Tensor) -> Tensor:
    """t_k = 1 - cos(pi/2 * k/n) for k = 0..n, computed in `like`'s dtype as upstream does."""
    t = torch.linspace(0, 1, n_steps + 1, device=like.device, dtype=like.dtype)
    return 1 - torch.cos(t * 0.5 * torch.pi)


@dataclass(frozen=True)
class EulerStep:
    """One recorded estimator call (for parity checks): its batch-of-2 inputs and output.

    Row 0 is conditional; row 1 has mu, spks and cond zeroed (x, mask and t are shared).
    """

    x: Tensor  # (2, 80, T)
    mask: Tensor  # (2, 1, T)
    mu: Tensor  # (2, 80, T)
    t: Tensor  # (2,)
    spks: Tensor  # (2, 80)
    cond: Tensor  # (2, 80, T)
    velocity: Tensor  # (2, 80, T)


class FlowMatchingSolver(nn.Module):
    """Euler solver of the flow ODE with classifier-free guidance (upstream's CFM `decoder`),
    around any estimator called as `estimator(x, mask, mu, t, spks, cond, streaming=...)`.

    Shared by CosyVoice 2 (U-Net estimator) and CosyVoice 3 (DiT estimator): the solver, the
    noise buffer and the schedule are the same. `rand_noise` is the fixed noise buffer:
    non-persistent (not in the state dict), created on CPU even when the module is built on
    the meta device, moved by `.to()`.
    """

    rand_noise: Tensor

    def __init__(self, cfm: CfmConfig, mel_bins: int, estimator: nn.Module) -> None:
        super().__init__()
        self.cfm = cfm
        self.estimator = estimator
        self.register_buffer("rand_noise", make_noise(cfm, mel_bins), persistent=False)

    def check_frames(self, num_frames: int) -> None:
        """Raise `InvalidRequestError` when the fixed noise is too short for `num_frames`."""
        if num_frames > self.rand_noise.size(-1):
            raise InvalidRequestError(
                f"flow: {num_frames} mel frames (prompt + target) exceed the noise buffer "
                f"of {self.rand_noise.size(-1)} frames"
            )

    def noise(self, num_frames: int) -> Tensor:
        """(1, 80, num_frames): the first frames of the fixed noise, times the temperature."""
        self.check_frames(num_frames)
        return self.rand_noise[:, :, :num_frames] * self.cfm.temperature

    def forward(
        self, noise: Tensor, mu: Tensor, mask: Tensor, spks: Tensor, cond: Tensor
    ) -> Tensor:
        """noise, mu, cond (1, 80, T); mask (1, 1, T); spks (1, 80) -> mel (1, 80, T).

        The traceable entry point (non-streaming): every input is a tensor.
        """
        return self.solve(noise, mu, mask, spks, cond)

    def solve(
        self,
        noise: Tensor,
        mu: Tensor,
        mask: Tensor,
        spks: Tensor,
        cond: Tensor,
        *,
        streaming: bool = False,
        record: list[EulerStep] | None = None,
        step_estimators: Sequence[Callable[..., Tensor]] | None = None,
        between_steps: Callable[[], None] | None = None,
    ) -> Tensor:
        """Integrate from `noise` with Euler steps; optionally append each step to `record`.

        `step_estimators` (one per step, called as the estimator is) replace the estimator:
        the incremental streaming flow passes its per-step caches (`flow_stream`).
        `between_steps` is called after every step but the last: a batch session runs a
        streamed job's work there instead of after the whole batched call."""
        t_span = cosine_schedule(self.cfm.n_timesteps, like=mu)
        rate = self.cfm.inference_cfg_rate
        # Rows :B are conditional; rows B: drop mu, speaker and prompt (zeros): the CFG baseline.
        mu_in = torch.cat([mu, torch.zeros_like(mu)])
        spks_in = torch.cat([spks, torch.zeros_like(spks)])
        cond_in = torch.cat([cond, torch.zeros_like(cond)])
        mask_in = torch.cat([mask, mask])
        x, t, dt = noise, t_span[0:1], t_span[1] - t_span[0]
        rows = x.size(0)  # B requests -> 2B estimator rows (conditional, then baseline)
        for step in range(1, self.cfm.n_timesteps + 1):
            x_in, t_in = torch.cat([x, x]), t.expand(2 * rows)
            estimator = self.estimator if step_estimators is None else step_estimators[step - 1]
            velocity = estimator(x_in, mask_in, mu_in, t_in, spks_in, cond_in, streaming=streaming)
            if record is not None:
                record.append(EulerStep(x_in, mask_in, mu_in, t_in, spks_in, cond_in, velocity))
            v_cond, v_uncond = velocity[:rows], velocity[rows:]
            x = x + dt * ((1.0 + rate) * v_cond - rate * v_uncond)
            # Upstream accumulates t and takes dt to the next schedule point from it.
            t = t + dt
            if step < self.cfm.n_timesteps:
                dt = t_span[step + 1] - t
                if between_steps is not None:
                    between_steps()
        return x


class ConditionalFlowMatching(FlowMatchingSolver):
    """CosyVoice 2's CFM: the solver around the causal U-Net estimator."""

    estimator: CausalConditionalDecoder

    def __init__(self, config: FlowConfig) -> None:
        super().__init__(config.cfm, config.mel_bins, CausalConditionalDecoder(config.estimator))


@dataclass(frozen=True)
class FlowIntermediates:
    """What `inference` computed on the way, for parity checks and debugging."""

    spk_proj: Tensor  # (1, 80)
    encoder_out: Tensor  # (1, T, 512)
    mu: Tensor  # (1, T, 80), time-major like upstream's encoder_proj output
    noise: Tensor  # (1, 80, T)
    cond: Tensor  # (1, 80, T)
    steps: list[EulerStep]


class CausalMaskedDiffWithXvec(nn.Module):
    """The flow stage; attribute names match the official checkpoint's keys."""

    def __init__(self, config: FlowConfig) -> None:
        super().__init__()
        self.config = config
        width = config.encoder.width
        self.input_embedding = Embedding(config.vocab_size, width)
        self.spk_embed_affine_layer = Linear(config.spk_embed_dim, config.mel_bins)
        self.encoder = UpsampleConformerEncoder(config.encoder)
        self.encoder_proj = Linear(width, config.mel_bins)
        self.decoder = ConditionalFlowMatching(config)

    def project_speaker(self, embedding: Tensor) -> Tensor:
        """Speaker embedding (1, 192) -> (1, 80): L2-normalised (in float32), then affine."""
        unit = F.normalize(embedding.float(), dim=1)
        return self.spk_embed_affine_layer(unit.to(self.spk_embed_affine_layer.weight.dtype))

    def embed_tokens(self, tokens: Tensor, lengths: Tensor | None = None) -> Tensor:
        """Token ids (B, T), int32 or int64 -> (B, T, D); negatives read row 0, padding zeroed."""
        h = self.input_embedding(torch.clamp(tokens, min=0))
        if lengths is None:
            return h
        valid = torch.arange(tokens.size(1), device=tokens.device) < lengths.unsqueeze(1)
        return h * valid.unsqueeze(-1).to(h.dtype)

    def encode(
        self, tokens: Tensor, *, finalize: bool = True, streaming: bool = False
    ) -> tuple[Tensor, Tensor]:
        """Prompt+target tokens (1, N) -> (encoder_out (1, T, D), mu (1, T, 80)).

        With finalize=False the last `pre_lookahead_len` tokens are look-ahead context only,
        so T = ratio * (N - pre_lookahead_len); otherwise T = ratio * N.
        """
        h = self.embed_tokens(tokens)
        context = None
        if not finalize:
            keep = h.size(1) - self.config.encoder.pre_lookahead_len
            h, context = h[:, :keep], h[:, keep:]
        encoder_out = self.encoder(h, context, streaming)
        return encoder_out, self.encoder_proj(encoder_out)

    def prompt_condition(self, prompt_feat: Tensor, num_frames: int) -> Tensor:
        """(1, 80, num_frames): the prompt mel (1, P', 80) in the first frames, zeros after."""
        cond = prompt_feat.new_zeros(1, num_frames, self.config.mel_bins)
        cond[:, : prompt_feat.size(1)] = prompt_feat
        return cond.transpose(1, 2)

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
        stage_done: Callable[[str], None] | None = None,
    ) -> tuple[Tensor, FlowIntermediates]:
        """Mel (1, 80, T_out) for `token` (1, N), after prompt tokens (1, P) / feat (1, 2P, 80).

        `embedding` is the (1, 192) speaker vector. The returned mel excludes the prompt frames.
        `record` collects every estimator call; `stage_done(name)` is called after the stages
        "speaker", "encoder" and "cfm" (for timing).
        """
        self._check_inputs(token, prompt_token, prompt_feat, embedding)
        self._check_length(token.size(1) + prompt_token.size(1), token.size(1), finalize)
        mark = stage_done or (lambda _stage: None)
        spks = self.project_speaker(embedding)
        mark("speaker")
        tokens = torch.cat([prompt_token, token.to(prompt_token.dtype)], dim=1)
        encoder_out, mu = self.encode(tokens, finalize=finalize, streaming=streaming)
        mark("encoder")
        num_frames, prompt_frames = mu.size(1), prompt_feat.size(1)
        cond = self.prompt_condition(prompt_feat.to(mu.dtype), num_frames)
        mask = mu.new_ones(1, 1, num_frames)
        noise = self.decoder.noise(num_frames).to(mu.device, mu.dtype)
        mel = self.decoder.solve(
            noise, mu.transpose(1, 2), mask, spks, cond, streaming=streaming, record=record
        )
        mark("cfm")
        extra = FlowIntermediates(spks, encoder_out, mu, noise, cond, record or [])
        return mel[:, :, prompt_frames:].float(), extra

    def _check_length(self, total_tokens: int, tokens: int, finalize: bool) -> None:
        """Reject, before any compute, a chunk too short for its look-ahead or too long."""
        lookahead = self.config.encoder.pre_lookahead_len
        if not finalize and tokens <= lookahead:
            raise InvalidRequestError(
                f"flow token: a non-final chunk needs more than {lookahead} tokens "
                f"(the last {lookahead} are look-ahead only), got {tokens}"
            )
        frames = self.config.token_mel_ratio * (total_tokens - (0 if finalize else lookahead))
        self.decoder.check_frames(frames)

    def _check_inputs(
        self, token: Tensor, prompt_token: Tensor, prompt_feat: Tensor, embedding: Tensor
    ) -> None:
        """Reject malformed requests with a message naming the field (not traced)."""
        cfg = self.config
        check_token_ids(token, prompt_token, cfg.vocab_size)
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


def check_token_ids(token: Tensor, prompt_token: Tensor, vocab_size: int) -> None:
    """A flow request's speech tokens, (1, N>0) and (1, P) integer ids below `vocab_size`, or
    an InvalidRequestError naming the field (both families' flows)."""
    if token.dim() != 2 or token.size(0) != 1 or token.size(1) == 0:
        raise InvalidRequestError(f"flow token: expected shape (1, N>0), got {tuple(token.shape)}")
    if prompt_token.dim() != 2 or prompt_token.size(0) != 1:
        raise InvalidRequestError(
            f"flow prompt_token: expected shape (1, P), got {tuple(prompt_token.shape)}"
        )
    for name, ids in (("token", token), ("prompt_token", prompt_token)):
        if ids.is_floating_point():
            raise InvalidRequestError(f"flow {name}: expected integer ids, got {ids.dtype}")
        if ids.numel() and int(ids.max()) >= vocab_size:
            raise InvalidRequestError(
                f"flow {name}: id {int(ids.max())} >= speech vocabulary {vocab_size}"
            )


def build_flow(
    config: FlowConfig,
    state_dict: Mapping[str, Tensor],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    source: Path | str = "flow.pt",
) -> CausalMaskedDiffWithXvec:
    """Build on the meta device, assign the checkpoint's tensors (strict), move, eval mode.

    Raises `ModelLoadError` naming `source` when keys or shapes differ from `config`.
    """
    with torch.device("meta"):
        flow = CausalMaskedDiffWithXvec(config)
    load_strict(flow, state_dict, source=source, assign=True)
    return flow.to(device=device, dtype=dtype).eval().requires_grad_(False)
