"""CosyVoice 3's vocoder (`CausalHiFTGenerator`): mel (B, 80, T) -> 24 kHz waveform (B, 480·T).

CosyVoice 2's HiFT made causal: conv_pre (kernel 5) looks 4 frames ahead, each upsampling stage
repeats frames and applies a left-padded conv, the source convs are strided and left-padded,
ResBlocks and conv_post pad on the left only. `finalize=False` (streaming) treats the last
look-ahead frames as context instead of zeros and drops the last 480 samples, so a non-final
call on T frames gives 480·(T − 8) samples that a later call on more frames reproduces.
The iSTFT, Snake and ResBlock pieces are CosyVoice 2's (`workers.model.hift`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from workers.model.causal_hift.config import CausalHiFTConfig
from workers.model.causal_hift.source import CausalF0Predictor, CausalSourceModule, SourceBuffer
from workers.model.checkpoint import load_strict
from workers.model.cpu_conv import Conv1d
from workers.model.hift.istft import ConvISTFT, SourceSTFT
from workers.model.hift.layers import ResBlock, fold_weight_norm, weight_norm
from workers.model.hift.model import (
    FINAL_LRELU_SLOPE,
    MAGNITUDE_LIMIT,
    HiFTOutput,
    _source_down_rates,
    normalize_hift_keys,
)


class PaddedConv1d(Conv1d):
    """A conv that pads itself: `left` zeros, then `right` frames of context (zeros by default);
    with `upsample` > 1 each input frame is first repeated (nearest-neighbour upsampling)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        *,
        stride: int = 1,
        left: int = 0,
        right: int = 0,
        upsample: int = 1,
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride)
        self.left, self.right, self.upsample = left, right, upsample

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, C, T) -> (B, C_out, T'); `context` (B, C, right) replaces the right zeros."""
        if self.upsample > 1:
            x = x.repeat_interleave(self.upsample, dim=2)
        if context is not None:
            x = torch.cat([x, context], dim=2)
        right = 0 if context is not None else self.right
        if self.left or right:
            x = F.pad(x, (self.left, right))
        return super().forward(x)


def _stage_channels(config: CausalHiFTConfig, stage: int) -> int:
    return config.base.base_channels // 2 ** (stage + 1)


class CausalHiFTGenerator(nn.Module):
    """The vocoder with the official state-dict layout (module registration order included)."""

    def __init__(self, config: CausalHiFTConfig) -> None:
        super().__init__()
        self.config = config
        base = config.base
        n_fft, rates = base.istft_n_fft, base.upsample_rates
        self.m_source = CausalSourceModule(base)
        look = config.conv_pre_look_right
        self.conv_pre = weight_norm(
            PaddedConv1d(base.in_channels, base.base_channels, look + 1, right=look)
        )
        self.ups = nn.ModuleList(
            weight_norm(
                PaddedConv1d(
                    base.base_channels // 2**i,
                    _stage_channels(config, i),
                    k,
                    left=k - 1,
                    upsample=u,
                )
            )
            for i, (u, k) in enumerate(zip(rates, base.upsample_kernel_sizes, strict=True))
        )
        self.source_downs = nn.ModuleList(
            PaddedConv1d(n_fft + 2, _stage_channels(config, i), 1)
            if u == 1
            else PaddedConv1d(n_fft + 2, _stage_channels(config, i), 2 * u, stride=u, left=u - 1)
            for i, u in enumerate(_source_down_rates(rates))
        )
        self.source_resblocks = nn.ModuleList(
            ResBlock(_stage_channels(config, i), k, d, causal=True)
            for i, (k, d) in enumerate(
                zip(
                    base.source_resblock_kernel_sizes,
                    base.source_resblock_dilation_sizes,
                    strict=True,
                )
            )
        )
        self.resblocks = nn.ModuleList(
            ResBlock(_stage_channels(config, i), k, d, causal=True)
            for i in range(len(rates))
            for k, d in zip(base.resblock_kernel_sizes, base.resblock_dilation_sizes, strict=True)
        )
        last = _stage_channels(config, len(rates) - 1)
        self.conv_post = weight_norm(PaddedConv1d(last, n_fft + 2, 7, left=6))
        self.f0_predictor = CausalF0Predictor(
            base.f0_in_channels, base.f0_cond_channels, base.f0_num_class, config.f0_look_right
        )
        self.stft = SourceSTFT(n_fft, base.istft_hop)
        self.istft = ConvISTFT(n_fft, base.istft_hop)
        self.source_buffer = SourceBuffer(config)

    def predict_f0(self, mel: torch.Tensor, *, finalize: bool = True) -> torch.Tensor:
        """mel (B, 80, T) -> f0 (B, T or T - 3) float32, computed in the predictor's float64."""
        return self.f0_predictor(mel.double(), finalize).float()

    def source(self, f0: torch.Tensor) -> torch.Tensor:
        """f0 (B, T) -> excitation (B, 1, 480·T), with the first 480·T samples of B as noise."""
        samples = f0.size(-1) * self.config.base.samples_per_frame
        noise = self.source_buffer.prefix(samples).transpose(1, 2).to(f0.device)
        return self.m_source(f0, noise.expand(f0.size(0), -1, -1))

    def decode(
        self, mel: torch.Tensor, source: torch.Tensor, *, finalize: bool = True
    ) -> torch.Tensor:
        """mel (B, 80, T), source (B, 1, 480·T) -> wav (B, 480·T), or (B, 480·(T − 5)) when not
        finalizing (4 frames of conv_pre context and one dropped frame)."""
        base = self.config.base
        mel = mel.to(self.conv_pre.weight.dtype)
        spec = self.stft(source[:, 0, :].float()).to(mel.dtype)  # (B, 18, 120·T + 1)
        look = self.config.conv_pre_look_right
        if finalize:
            x = self.conv_pre(mel)
        else:
            x = self.conv_pre(mel[:, :, :-look], mel[:, :, -look:])
            spec = spec[:, :, : spec.size(-1) - look * base.samples_per_frame // base.istft_hop]
        x = self._stages(x, spec)
        x = self.conv_post(F.leaky_relu(x, FINAL_LRELU_SLOPE)).float()
        bins = base.n_bins
        magnitude = torch.exp(x[:, :bins, :]).clamp(max=MAGNITUDE_LIMIT)
        phase = torch.sin(x[:, bins:, :])
        wav = self.istft(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        if not finalize:
            wav = wav[:, : wav.size(-1) - base.samples_per_frame]
        return wav.clamp(-base.audio_limit, base.audio_limit)

    def _stages(self, x: torch.Tensor, spec: torch.Tensor) -> torch.Tensor:
        """The upsampling stages, each fused with the downsampled source spectrum."""
        per_stage = len(self.config.base.resblock_kernel_sizes)
        last = len(self.ups) - 1
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, self.config.base.lrelu_slope))
            if i == last:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](spec))
            blocks = self.resblocks[i * per_stage : (i + 1) * per_stage]
            total = blocks[0](x)
            for block in blocks[1:]:
                total = total + block(x)
            x = total / per_stage
        return x

    @torch.inference_mode()
    def inference(self, mel: torch.Tensor, *, finalize: bool = True) -> HiFTOutput:
        """mel (B, 80, T) -> HiFTOutput(wav, source, f0); deterministic (fixed buffer).

        finalize=False: F0 looks 3 frames ahead into `mel` and conv_pre 4 more, so the wav has
        480·(T − 8) samples and the source/f0 cover T − 3 frames.
        """
        self.source_buffer.check_samples(mel.size(-1) * self.config.base.samples_per_frame)
        f0 = self.predict_f0(mel, finalize=finalize)
        source = self.source(f0)
        frames = mel if finalize else mel[:, :, : mel.size(-1) - self.config.f0_look_right]
        return HiFTOutput(self.decode(frames, source, finalize=finalize), source, f0)


def build_causal_hift(
    config: CausalHiFTConfig,
    state_dict: Mapping[str, torch.Tensor],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    source: Path | str = "hift.pt",
) -> CausalHiFTGenerator:
    """Build on meta, load strictly (upstream's key renaming), keep the F0 predictor in float64
    (as upstream's inference does), fold weight norm, eval mode."""
    with torch.device("meta"):
        model = CausalHiFTGenerator(config)
    load_strict(model, normalize_hift_keys(state_dict, source=source), source=source, assign=True)
    model.f0_predictor.to(torch.float64)
    fold_weight_norm(model)
    model.to(device=device)
    for name, child in model.named_children():
        if name not in {"m_source", "stft", "istft", "f0_predictor"}:
            child.to(dtype=dtype)
    return model.eval()
