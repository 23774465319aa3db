"""HiFT vocoder (CosyVoice 2's HiFTGenerator): mel (B, 80, T) -> 24 kHz waveform (B, 480·T).

Neural source filter + iSTFTNet: the F0 predictor and sine source (`hift_source`) make an
excitation, whose STFT is fused into three upsampling stages of residual blocks; the network
outputs log-magnitude and phase of an n_fft 16 / hop 4 spectrum, inverted by `ConvISTFT`.

Loading accepts what upstream's loader accepts: keys with any `generator.` substring (a
HiFi-GAN training checkpoint) and the legacy `weight_g`/`weight_v` weight-norm names, both
renamed to the current `parametrizations.weight.original0/1` names before a strict load.
`build_hift` then folds weight norm into plain weights (see `hift_layers`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from shared.errors import ModelLoadError
from workers.model.checkpoint import load_strict
from workers.model.cpu_conv import Conv1d
from workers.model.hift.config import HiFTConfig
from workers.model.hift.istft import ConvISTFT, SourceSTFT
from workers.model.hift.layers import ResBlock, fold_weight_norm, wn_conv1d, wn_conv_transpose1d
from workers.model.hift.source import F0Predictor, SourceModule, SourceNoise, draw_source_noise

MAGNITUDE_LIMIT = 100.0  # upstream clips exp(log-magnitude) at 1e2 before the inverse STFT
FINAL_LRELU_SLOPE = 0.01  # the last leaky ReLU uses torch's default slope, not lrelu_slope
# The source (phase up to ~4e3 rad) and both transforms stay float32 whatever `dtype` is; so
# does the (small) F0 predictor: in bf16 its f0 moved enough for the sine source's phase to
# drift (waveform SNR ~9 dB on the tiny model while the decoder alone kept 35 dB).
_FLOAT32_CHILDREN = ("m_source", "stft", "istft", "f0_predictor")
_LEGACY_SUFFIXES = {
    ".weight_g": ".parametrizations.weight.original0",
    ".weight_v": ".parametrizations.weight.original1",
}


@dataclass(frozen=True)
class HiFTOutput:
    """wav (B, L) in [−limit, limit]; source (B, 1, L) excitation; f0 (B, T) Hz."""

    wav: torch.Tensor
    source: torch.Tensor
    f0: torch.Tensor


class HiFTGenerator(nn.Module):
    """The vocoder with the official state-dict layout (module registration order included)."""

    def __init__(self, config: HiFTConfig) -> None:
        super().__init__()
        self.config = config
        base, n_fft = config.base_channels, config.istft_n_fft
        self.m_source = SourceModule(config)
        self.conv_pre = wn_conv1d(config.in_channels, base, 7, padding=3)
        self.ups = nn.ModuleList(
            wn_conv_transpose1d(base // 2**i, base // 2 ** (i + 1), k, u)
            for i, (u, k) in enumerate(
                zip(config.upsample_rates, config.upsample_kernel_sizes, strict=True)
            )
        )
        self.source_downs = nn.ModuleList(
            _source_down(n_fft + 2, base // 2 ** (i + 1), rate)
            for i, rate in enumerate(_source_down_rates(config.upsample_rates))
        )
        self.source_resblocks = nn.ModuleList(
            ResBlock(base // 2 ** (i + 1), k, d)
            for i, (k, d) in enumerate(
                zip(
                    config.source_resblock_kernel_sizes,
                    config.source_resblock_dilation_sizes,
                    strict=True,
                )
            )
        )
        self.resblocks = nn.ModuleList(
            ResBlock(base // 2 ** (i + 1), k, d)
            for i in range(len(config.upsample_rates))
            for k, d in zip(
                config.resblock_kernel_sizes, config.resblock_dilation_sizes, strict=True
            )
        )
        self.conv_post = wn_conv1d(base // 2 ** len(config.upsample_rates), n_fft + 2, 7, padding=3)
        self.f0_predictor = F0Predictor(
            config.f0_in_channels, config.f0_cond_channels, config.f0_num_class
        )
        self.stft = SourceSTFT(n_fft, config.istft_hop)
        self.istft = ConvISTFT(n_fft, config.istft_hop)

    def forward(self, mel: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """mel: (B, 80, T), noise: (B, H, 480·T) standard normal -> wav (B, 480·T).

        The traceable whole-vocoder graph (the Core ML conversion's entry point).
        """
        f0 = self.predict_f0(mel)
        return self.decode(mel, self.m_source(f0, noise))

    def predict_f0(self, mel: torch.Tensor) -> torch.Tensor:
        """mel (B, 80, T) -> f0 (B, T), in the predictor's own dtype (float32)."""
        return self.f0_predictor(mel.to(self.f0_predictor.classifier.weight.dtype))

    def decode(self, mel: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """mel: (B, 80, T), source: (B, 1, 480·T) -> wav (B, 480·T), float32."""
        real, imag = self.spectrum(mel, source)
        return self.istft(real, imag).clamp(-self.config.audio_limit, self.config.audio_limit)

    def spectrum(
        self, mel: torch.Tensor, source: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """mel: (B, 80, T), source: (B, 1, 480·T) -> output spectrum (real, imag), each
        (B, bins, 120·T + 1) float32, before the inverse STFT."""
        mel = mel.to(self.conv_pre.weight.dtype)
        spec = self.stft(source[:, 0, :].float()).to(mel.dtype)  # (B, 2·bins, 120·T + 1)
        x = self.conv_pre(mel)
        time_major = self.conv_pre.weight.is_mkldnn  # packed convs (`cpu_conv`) on this host
        per_stage = len(self.config.resblock_kernel_sizes)
        last = len(self.ups) - 1
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, self.config.lrelu_slope))
            if i == last:
                x = F.pad(x, (1, 0), mode="reflect")
            if time_major:  # as the packed convs' outputs it meets, so no add mixes layouts
                x = x.transpose(1, 2).contiguous().transpose(1, 2)
            x.add_(self.source_resblocks[i](self.source_downs[i](spec)))  # x is fresh
            blocks = self.resblocks[i * per_stage : (i + 1) * per_stage]
            total = blocks[0](x)
            for block in blocks[1:]:
                total.add_(block(x))  # fresh tensors: accumulate in place (as upstream does)
            x = total.div_(per_stage)
        x = self.conv_post(F.leaky_relu(x, FINAL_LRELU_SLOPE)).float()
        bins = self.config.n_bins
        magnitude = torch.exp(x[:, :bins, :]).clamp(max=MAGNITUDE_LIMIT)
        phase = torch.sin(x[:, bins:, :])  # upstream's (redundant) sin of the raw output
        return magnitude * torch.cos(phase), magnitude * torch.sin(phase)

    @torch.inference_mode()
    def inference(
        self,
        mel: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        noise: SourceNoise | None = None,
        source_prefix: torch.Tensor | None = None,
    ) -> HiFTOutput:
        """mel (B, 80, T) -> HiFTOutput; random draws from `noise`, else from `generator`.

        `source_prefix` (B, 1, P) overwrites the start of the excitation (upstream's streaming
        `cache_source`, which avoids glitches between chunks).
        """
        if noise is None:
            samples = mel.shape[-1] * self.config.samples_per_frame
            noise = draw_source_noise(
                mel.shape[0],
                self.m_source.harmonics,
                samples,
                generator=generator,
                device=mel.device,
            )
        f0 = self.predict_f0(mel)
        source = self.m_source(f0, noise.normal.to(mel.device))
        if source_prefix is not None and source_prefix.shape[-1] > 0:
            source = source.clone()
            source[:, :, : source_prefix.shape[-1]] = source_prefix
        return HiFTOutput(self.decode(mel, source), source, f0.float())


def _source_down_rates(upsample_rates: tuple[int, ...]) -> list[int]:
    """Downsampling of the source spectrum to each stage's rate: [8,5,3] -> [15, 3, 1]."""
    rates, total = [], 1
    for rate in (1, *reversed(upsample_rates[1:])):
        total *= rate
        rates.append(total)
    return rates[::-1]


def _source_down(in_channels: int, out_channels: int, rate: int) -> nn.Conv1d:
    if rate == 1:
        return Conv1d(in_channels, out_channels, 1)
    return Conv1d(in_channels, out_channels, rate * 2, rate, padding=rate // 2)


def normalize_hift_key(key: str) -> str:
    """Upstream loader's renaming of one key: drop every `generator.`, map weight_g/_v names."""
    name = key.replace("generator.", "")
    for legacy, current in _LEGACY_SUFFIXES.items():
        if name.endswith(legacy):
            return name[: -len(legacy)] + current
    return name


def normalize_hift_keys(
    state: Mapping[str, torch.Tensor], *, source: Path | str = "hift.pt"
) -> dict[str, torch.Tensor]:
    """`normalize_hift_key` over a state dict; two keys that collide are a load error."""
    renamed: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        name = normalize_hift_key(key)
        if name in renamed:
            raise ModelLoadError(
                f"{source}: keys {key!r} and another both become {name!r} after renaming "
                "(both weight-norm styles, or with and without `generator.`?)"
            )
        renamed[name] = value
    return renamed


def build_hift(
    config: HiFTConfig,
    state_dict: Mapping[str, torch.Tensor],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    source: Path | str = "hift.pt",
    fold: bool = True,
) -> HiFTGenerator:
    """Build on meta, load strictly (weights assigned, no copy), fold weight norm, eval mode."""
    with torch.device("meta"):
        model = HiFTGenerator(config)
    load_strict(model, normalize_hift_keys(state_dict, source=source), source=source, assign=True)
    if fold:
        fold_weight_norm(model)
    model.to(device=device)
    for name, child in model.named_children():
        if name not in _FLOAT32_CHILDREN:
            child.to(dtype=dtype)
    return model.eval()
