"""HiFT's excitation: the F0 predictor and the harmonic-plus-noise sine source (SineGen2).

Upstream builds the source at the audio rate: f0 is repeated ×480 per frame, turned into
per-sample phase increments, linearly resampled by 1/480 back to one value per frame, summed,
and linearly resampled ×480 again. Linear resampling by 1/480 with align_corners=False reads
only samples 480·j + 239 and 480·j + 240 of each frame, which are equal, so it returns the
frame's own increment exactly. We therefore compute the increments at the FRAME rate and do
only the ×480 step: the result is bitwise identical (checked against the reference), cheaper,
and converts to Core ML (1/480 interpolation with flexible length does not).

A consequence upstream carries silently: SineGen2's random initial phase is added to sample 0
only, which the 1/480 resampling never reads, so it has no effect. We still draw it (keeping a
seeded generator's stream aligned with upstream's) and `sine_waves_audio_rate` keeps upstream's
exact order of operations, initial phase included, so the parity check proves both claims.

Randomness is injected: `SourceNoise` holds the draws; `draw_source_noise` makes them from a
per-request `torch.Generator` in upstream's order (a generator seeded like upstream's global
seed reproduces its draws on CPU). The phase reaches ~4e3 rad, so the source always runs in
float32 whatever dtype the convolutions use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from workers.model.hift.config import HiFTConfig
from workers.model.hift.layers import wn_conv1d

F0_PREDICTOR_LAYERS = 5  # ConvRNNF0Predictor: five conv k3 + ELU


class F0Predictor(nn.Module):
    """ConvRNNF0Predictor: 5 × (weight-normed conv k3 → ELU), Linear, |·|; f0 in Hz per frame."""

    def __init__(self, in_channels: int, cond_channels: int, num_class: int = 1) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(F0_PREDICTOR_LAYERS):
            width_in = in_channels if i == 0 else cond_channels
            layers += [wn_conv1d(width_in, cond_channels, 3, padding=1), nn.ELU()]
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cond_channels, num_class)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel: (B, n_mels, T) -> f0: (B, T)."""
        hidden = self.condnet(mel).transpose(1, 2)  # (B, T, C)
        return self.classifier(hidden).squeeze(-1).abs()


@dataclass(frozen=True)
class SourceNoise:
    """The sine source's two random draws for one request.

    rand_ini: (B, H) uniform [0, 1): SineGen2's initial phases in cycles (no effect; see module).
    normal: (B, H, L) standard normal; scaled by 0.003 (voiced) or 0.1/3 (unvoiced) inside.
    """

    rand_ini: torch.Tensor
    normal: torch.Tensor


def draw_source_noise(
    batch: int,
    harmonics: int,
    num_samples: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | None = None,
) -> SourceNoise:
    """Draw in upstream's order on the generator's device, then move to `device`.

    Upstream fills its (B, L, H) noise through a channel-major view; filling our (B, H, L)
    tensor through the same transposed view consumes a CPU generator identically.
    """
    draw_device = generator.device if generator is not None else torch.device("cpu")
    rand_ini = torch.rand(batch, harmonics, generator=generator, device=draw_device)
    normal = torch.empty(batch, harmonics, num_samples, device=draw_device)
    normal.transpose(1, 2).normal_(generator=generator)
    target = device if device is not None else draw_device
    return SourceNoise(rand_ini.to(target), normal.to(target))


class SourceModule(nn.Module):
    """SourceModuleHnNSF2: SineGen2 harmonics + noise, merged by `l_linear` and tanh."""

    def __init__(self, config: HiFTConfig) -> None:
        super().__init__()
        self.harmonics = config.nb_harmonics + 1
        self.sampling_rate = config.sampling_rate
        self.upsample = config.samples_per_frame
        self.sine_amp = config.nsf_alpha
        self.noise_std = config.nsf_sigma
        self.voiced_threshold = config.nsf_voiced_threshold
        self.l_linear = nn.Linear(self.harmonics, 1)

    def frame_phase(self, f0: torch.Tensor) -> torch.Tensor:
        """f0: (B, T) Hz -> (B, H, T) rad: 480 · 2π · running sum over frames of the per-sample
        increment k·f0/sr mod 1 (cycles), the value the ×480 interpolation puts at frame centres."""
        harmonic = torch.arange(1, self.harmonics + 1, dtype=f0.dtype, device=f0.device)
        increments = (f0[:, None, :] * harmonic[None, :, None] / self.sampling_rate) % 1
        phase = torch.cumsum(increments, dim=2) * 2 * math.pi
        return phase * self.upsample

    def upsample_phase(self, phase: torch.Tensor) -> torch.Tensor:
        """(B, H, T) frame phases -> (B, H, 480·T): linear interpolation (SineGen2)."""
        return F.interpolate(phase, scale_factor=self.upsample, mode="linear")

    def sine_waves(
        self, f0: torch.Tensor, normal: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """f0: (B, T), normal: (B, H, L) -> (harmonics + noise (B, H, L), uv (B, 1, L))."""
        phase = self.upsample_phase(self.frame_phase(f0))
        sines = torch.sin(phase) * self.sine_amp
        uv = torch.repeat_interleave((f0 > self.voiced_threshold).to(f0.dtype), self.upsample, 1)
        return self._add_noise(sines, uv[:, None, :], normal), uv[:, None, :]

    def noise_amplitude(self, uv: torch.Tensor) -> torch.Tensor:
        """Noise std per sample: nsf_sigma where voiced, nsf_alpha / 3 where unvoiced."""
        return uv * self.noise_std + (1 - uv) * self.sine_amp / 3

    def _add_noise(
        self, sines: torch.Tensor, uv: torch.Tensor, normal: torch.Tensor
    ) -> torch.Tensor:
        return sines * uv + self.noise_amplitude(uv) * normal

    def merge(self, waves: torch.Tensor) -> torch.Tensor:
        """waves: (B, H, L) -> source (B, 1, L) = tanh(l_linear over harmonics)."""
        return torch.tanh(self.l_linear(waves.transpose(1, 2))).transpose(1, 2)

    def forward(self, f0: torch.Tensor, normal: torch.Tensor) -> torch.Tensor:
        """f0: (B, T) Hz, normal: (B, H, T·480) -> excitation (B, 1, T·480), float32."""
        waves, _ = self.sine_waves(f0.float(), normal.float())
        return self.merge(waves.to(self.l_linear.weight.dtype)).float()


def sine_waves_audio_rate(
    source: SourceModule, f0: torch.Tensor, noise: SourceNoise
) -> tuple[torch.Tensor, torch.Tensor]:
    """Upstream SineGen2's order of operations at the audio rate, initial phase included.

    Used only by the parity check, to prove the frame-rate path equal. Returns the same
    (waves (B, H, L), uv (B, 1, L)) as `SourceModule.sine_waves`.
    """
    scale = source.upsample
    f0_up = F.interpolate(f0[:, None, :], scale_factor=float(scale), mode="nearest")  # (B,1,L)
    harmonic = torch.arange(1, source.harmonics + 1, dtype=f0.dtype, device=f0.device)
    increments = (f0_up.transpose(1, 2) * harmonic / source.sampling_rate) % 1  # (B, L, H)
    rand_ini = noise.rand_ini.clone()
    rand_ini[:, 0] = 0
    increments[:, 0, :] = increments[:, 0, :] + rand_ini
    per_frame = F.interpolate(increments.transpose(1, 2), scale_factor=1 / scale, mode="linear")
    phase = torch.cumsum(per_frame.transpose(1, 2), dim=1) * 2 * math.pi
    phase = F.interpolate(phase.transpose(1, 2) * scale, scale_factor=float(scale), mode="linear")
    sines = torch.sin(phase) * source.sine_amp
    uv = (f0_up > source.voiced_threshold).to(f0.dtype)
    return source._add_noise(sines, uv, noise.normal), uv
