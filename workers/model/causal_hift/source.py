"""CosyVoice 3's excitation: the causal F0 predictor and the sine source with a fixed noise buffer.

F0: `CausalF0Predictor` (kernel-4 conv seeing 3 frames ahead, four causal kernel-3 convs, ELU
after each, Linear, |.|) runs in float64 as upstream's `inference` does (its module is cast in
place); the weights are kept in float64 by `build_causal_hift`.

Source: CosyVoice 2's SineGen2 arithmetic with two causal changes: the frame phase is repeated
over each frame's 480 samples ('nearest') instead of interpolated, and the noise is a fixed
buffer B of uniform [0, 1) numbers, shape (1, 7 200 000, 9), that upstream draws from torch's
global CPU generator while the model is built. B is not in hift.pt, yet it changes the output.
`SourceBuffer` reproduces it without holding 259 MB: it replays the official construction
order up to the draw once (`official_buffer_state`: seed 0, the CFM noise, the flow's token
embedding and speaker projection, the F0 predictor's init, `rand_ini`), keeps that generator
state, and draws only the prefix a request needs (CPU uniform draws are serial, so a prefix of
a shorter draw equals the prefix of the full one). The prefix drawn so far is cached.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F
from torch import nn

from shared.errors import InvalidRequestError
from workers.model.causal_hift.config import CausalHiFTConfig
from workers.model.flow.config import NOISE_FRAMES, NOISE_SEED
from workers.model.hift.layers import wn_conv1d
from workers.model.hift.source import SourceModule

F0_HIDDEN_LAYERS = 4  # kernel-3 causal convs after the look-ahead conv
# What the published model builds between the CFM's reseed and the HiFT (cosyvoice3.yaml order).
FLOW_VOCAB, FLOW_MELS, SPEAKER_DIM = 6561, 80, 192
BUFFER_GROWTH = 24000  # the cached prefix grows in whole seconds of audio


class CausalF0Predictor(nn.Module):
    """CausalConvRNNF0Predictor; keys condnet.{0,2,4,6,8} (weight-normed) and classifier."""

    def __init__(self, in_channels: int, cond_channels: int, num_class: int, look_right: int):
        super().__init__()
        self.look_right = look_right
        layers: list[nn.Module] = [wn_conv1d(in_channels, cond_channels, look_right + 1), nn.ELU()]
        for _ in range(F0_HIDDEN_LAYERS):
            layers += [wn_conv1d(cond_channels, cond_channels, 3), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, num_class)

    def forward(self, mel: torch.Tensor, finalize: bool = True) -> torch.Tensor:
        """mel (B, 80, T) -> f0 (B, T), or (B, T - look_right) when not finalizing (the last
        frames are then look-ahead context instead of zeros). Runs in the weights' dtype."""
        x = mel.to(self.classifier.weight.dtype)
        if finalize:
            x = F.pad(x, (0, self.look_right))
        x = self.condnet[1](self.condnet[0](x))
        for i in range(2, len(self.condnet), 2):  # kernel-3 convs: 2 zeros on the left
            x = self.condnet[i + 1](self.condnet[i](F.pad(x, (2, 0))))
        return self.classifier(x.transpose(1, 2)).squeeze(-1).abs()


def official_buffer_state(
    config: CausalHiFTConfig, *, before_rand_ini: bool = False
) -> torch.Tensor:
    """The CPU generator state right before upstream draws B (see the module docstring).

    Replays, on a forked global RNG (the caller's stream is left alone), the draws the official
    construction makes after the CFM reseeds to 0.
    """
    base = config.base
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(NOISE_SEED)
        torch.randn(1, FLOW_MELS, NOISE_FRAMES)  # the CFM's noise
        nn.Embedding(FLOW_VOCAB, FLOW_MELS)  # flow.input_embedding
        nn.Linear(SPEAKER_DIM, FLOW_MELS)  # flow.spk_embed_affine_layer
        nn.Conv1d(base.f0_in_channels, base.f0_cond_channels, config.f0_look_right + 1)
        for _ in range(F0_HIDDEN_LAYERS):
            nn.Conv1d(base.f0_cond_channels, base.f0_cond_channels, 3)
        nn.Linear(base.f0_cond_channels, base.f0_num_class)
        if before_rand_ini:
            return torch.get_rng_state()
        torch.rand(1, base.nb_harmonics + 1)  # rand_ini (no effect on the output)
        return torch.get_rng_state()


def official_rand_ini(config: CausalHiFTConfig) -> torch.Tensor:
    """Upstream's fixed initial phases (1, harmonics), entry 0 zeroed: drawn just before B.

    They have no effect on the output (see `workers.model.hift.source`); made only to check
    the replayed construction order against a reference set."""
    generator = torch.Generator().set_state(official_buffer_state(config, before_rand_ini=True))
    rand_ini = torch.rand(1, config.base.nb_harmonics + 1, generator=generator)
    rand_ini[:, 0] = 0
    return rand_ini


class SourceBuffer:
    """Upstream's fixed uniform buffer B, generated on demand: `prefix(n)` = B[:, :n]."""

    def __init__(self, config: CausalHiFTConfig) -> None:
        self.config = config
        self.harmonics = config.base.nb_harmonics + 1
        self._state: torch.Tensor | None = None
        self._cache = torch.empty(1, 0, self.harmonics)
        self._lock = threading.Lock()

    def check_samples(self, samples: int) -> None:
        """Raise `InvalidRequestError` when `samples` exceed upstream's 300 s buffer."""
        if samples > self.config.buffer_samples:
            raise InvalidRequestError(
                f"hift: {samples} samples exceed the source buffer of "
                f"{self.config.buffer_samples} samples (300 s)"
            )

    def prefix(self, samples: int) -> torch.Tensor:
        """(1, samples, harmonics) float32 on CPU: the first samples of B."""
        self.check_samples(samples)
        cache = self._cache
        if cache.size(1) < samples:
            with self._lock:
                if self._state is None:
                    self._state = official_buffer_state(self.config)
                grown = -(-samples // BUFFER_GROWTH) * BUFFER_GROWTH
                length = min(grown, self.config.buffer_samples)
                generator = torch.Generator().set_state(self._state)
                cache = torch.rand(1, length, self.harmonics, generator=generator)
                self._cache = cache
        return cache[:, :samples]


class CausalSourceModule(SourceModule):
    """SourceModuleHnNSF2 (causal): frame phases repeated per frame, the noise taken from B."""

    def upsample_phase(self, phase: torch.Tensor) -> torch.Tensor:
        """(B, H, T) frame phases -> (B, H, 480·T), constant within each frame ('nearest')."""
        return phase.repeat_interleave(self.upsample, dim=2)
