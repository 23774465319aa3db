"""HiFT's short-time Fourier transforms (n_fft 16, hop 4, periodic Hann), written to convert.

`torch.istft` has no Core ML converter and complex tensors do not convert at all, so the inverse
transform here is real arithmetic: the one-sided inverse DFT times the synthesis window is a
fixed (2·bins, 1, n_fft) kernel, overlap-add is `conv_transpose1d` with stride hop, and the
window-square envelope it divides by is the same transposed convolution run on ones. It matches
`torch.istft(center=True)` to float32 rounding (checked against it in `reference_hift`). The
forward transform stays `torch.stft`, which Core ML lowers to convolutions.

The window is upstream's `scipy.signal.get_window("hann", n_fft, fftbins=True)` as float32:
computed in float64 and rounded once (torch.hann_window computes in float32 and differs by an
ulp). Window and DFT bases are computed from numpy, so they stay real tensors even when the
module is built on the meta device, and are never part of the state dict.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def periodic_hann_f64(n_fft: int) -> np.ndarray:
    """Periodic Hann window 0.5 − 0.5·cos(2πn/N), float64."""
    n = np.arange(n_fft, dtype=np.float64)
    return 0.5 - 0.5 * np.cos(2.0 * np.pi * n / n_fft)


def inverse_dft_bases(n_fft: int) -> np.ndarray:
    """(2·bins, 1, n_fft) float64 kernel: real rows then imaginary rows of irfft·window.

    x[n] = (1/N)·[Re X₀ + Re X_{N/2}·(−1)ⁿ + 2·Σ_k (Re X_k·cos(2πkn/N) − Im X_k·sin(2πkn/N))];
    like irfft, the imaginary parts of the DC and Nyquist bins do not contribute.
    """
    bins = n_fft // 2 + 1
    k = np.arange(bins, dtype=np.float64)[:, None]
    n = np.arange(n_fft, dtype=np.float64)[None, :]
    angle = 2.0 * np.pi * k * n / n_fft
    weight = np.full((bins, 1), 2.0)
    weight[0] = 1.0
    if n_fft % 2 == 0:
        weight[-1] = 1.0
    real = weight * np.cos(angle) / n_fft
    imag = -weight * np.sin(angle) / n_fft
    imag[0] = 0.0
    if n_fft % 2 == 0:
        imag[-1] = 0.0
    window = periodic_hann_f64(n_fft)[None, :]
    return np.concatenate([real * window, imag * window])[:, None, :]


class SourceSTFT(nn.Module):
    """One-sided STFT with center reflect padding, real and imaginary parts stacked."""

    window: torch.Tensor

    def __init__(self, n_fft: int, hop: int) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        window = torch.from_numpy(periodic_hann_f64(n_fft).astype(np.float32))
        self.register_buffer("window", window, persistent=False)

    def forward(self, signal: torch.Tensor) -> torch.Tensor:
        """signal: (B, L) float32 -> (B, 2·bins, L // hop + 1): real rows then imaginary rows."""
        spec = torch.stft(
            signal,
            self.n_fft,
            self.hop,
            self.n_fft,
            window=self.window.to(signal.dtype),
            center=True,
            pad_mode="reflect",
            return_complex=True,
        )
        spec = torch.view_as_real(spec)  # (B, bins, frames, 2)
        return torch.cat([spec[..., 0], spec[..., 1]], dim=1)


class ConvISTFT(nn.Module):
    """Inverse of `SourceSTFT` (center=True, no `length`) as conv_transpose1d; no complex ops."""

    bases: torch.Tensor
    window_sq: torch.Tensor

    def __init__(self, n_fft: int, hop: int) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        bases = torch.from_numpy(inverse_dft_bases(n_fft).astype(np.float32))
        window_sq = torch.from_numpy((periodic_hann_f64(n_fft) ** 2).astype(np.float32))
        self.register_buffer("bases", bases, persistent=False)
        self.register_buffer("window_sq", window_sq.view(1, 1, n_fft), persistent=False)

    def forward(self, real: torch.Tensor, imag: torch.Tensor) -> torch.Tensor:
        """real, imag: (B, bins, F) -> (B, hop·(F − 1)) samples."""
        spec = torch.cat([real, imag], dim=1)
        frames = F.conv_transpose1d(spec, self.bases.to(spec.dtype), stride=self.hop)
        ones = torch.ones_like(spec[:1, :1, :])
        envelope = F.conv_transpose1d(ones, self.window_sq.to(spec.dtype), stride=self.hop)
        trim = self.n_fft // 2
        signal = frames[:, 0, trim:-trim] / envelope[:, 0, trim:-trim]
        return signal


def torch_istft(real: torch.Tensor, imag: torch.Tensor, n_fft: int, hop: int) -> torch.Tensor:
    """Upstream's inverse (`torch.istft` on a complex spectrum): the reference `ConvISTFT` meets."""
    window = torch.from_numpy(periodic_hann_f64(n_fft).astype(np.float32)).to(real.device)
    return torch.istft(
        torch.complex(real, imag), n_fft, hop, n_fft, window=window.to(real.dtype), center=True
    )
