"""Mel filterbanks and analysis windows for the three prompt features, computed by our code.

- `slaney_mel_filterbank`: librosa's `filters.mel` (Slaney mel scale, area normalisation), the
  basis of the 24 kHz prompt mel (Matcha) and of whisper's 128-band log-mel. Computed in
  float64 and stored as float32 the way librosa does it: each triangle is rounded to float32,
  then scaled by its float64 normaliser and rounded again (this reproduces both stored banks
  bitwise; a single final rounding differs by one float32 ulp in places).
- `kaldi_mel_banks`: Kaldi's triangles on the 1127·ln(1 + f/700) scale, built in float32 in
  the same order of operations as torchaudio's `compliance.kaldi`, plus the zero Nyquist column.
- windows: torch's float32 `hann_window` (whisper, Matcha) and Kaldi's povey window.
"""

from __future__ import annotations

import math

import numpy as np
import torch

SLANEY_HZ_PER_MEL = 200.0 / 3  # linear part of the Slaney scale: 3 mels per 200 Hz
SLANEY_LOG_START_HZ = 1000.0  # log part starts here (15 mels)
SLANEY_LOG_STEP = math.log(6.4) / 27.0  # 27 mels per factor 6.4 in frequency
KALDI_MEL_SCALE = 1127.0  # mel = 1127·ln(1 + f / 700)
KALDI_MEL_BREAK_HZ = 700.0
POVEY_POWER = 0.85  # povey window = symmetric Hann ** 0.85


def hz_to_slaney_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney mel scale (librosa's default, htk=False), float64."""
    hz = np.asarray(hz, dtype=np.float64)
    mels = hz / SLANEY_HZ_PER_MEL
    log_start_mel = SLANEY_LOG_START_HZ / SLANEY_HZ_PER_MEL
    above = hz >= SLANEY_LOG_START_HZ
    safe = np.where(above, hz, SLANEY_LOG_START_HZ)
    return np.where(
        above, log_start_mel + np.log(safe / SLANEY_LOG_START_HZ) / SLANEY_LOG_STEP, mels
    )


def slaney_mel_to_hz(mels: np.ndarray) -> np.ndarray:
    """Inverse of `hz_to_slaney_mel`, float64."""
    mels = np.asarray(mels, dtype=np.float64)
    log_start_mel = SLANEY_LOG_START_HZ / SLANEY_HZ_PER_MEL
    hz = SLANEY_HZ_PER_MEL * mels
    log_hz = SLANEY_LOG_START_HZ * np.exp(SLANEY_LOG_STEP * (mels - log_start_mel))
    return np.where(mels >= log_start_mel, log_hz, hz)


def slaney_mel_filterbank(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None
) -> np.ndarray:
    """(n_mels, n_fft // 2 + 1) float32 triangles, area-normalised (librosa `filters.mel`)."""
    fmax = sample_rate / 2 if fmax is None else fmax
    fft_hz = np.fft.rfftfreq(n_fft, d=1.0 / sample_rate)
    low, high = hz_to_slaney_mel(np.array(fmin)), hz_to_slaney_mel(np.array(fmax))
    edges_hz = slaney_mel_to_hz(np.linspace(low, high, n_mels + 2))
    widths = np.diff(edges_hz)
    ramps = edges_hz[:, None] - fft_hz[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    triangles = np.maximum(0.0, np.minimum(rising, falling)).astype(np.float32)
    area_norm = 2.0 / (edges_hz[2:] - edges_hz[:-2])
    return (triangles * area_norm[:, None]).astype(np.float32)


def kaldi_mel_banks(
    num_bins: int,
    padded_window: int,
    sample_rate: float,
    low_hz: float,
    high_hz: float,
) -> torch.Tensor:
    """(num_bins, padded_window // 2 + 1) float32; `high_hz` <= 0 counts back from Nyquist."""
    if high_hz <= 0.0:
        high_hz += 0.5 * sample_rate
    mel_low = KALDI_MEL_SCALE * math.log(1.0 + low_hz / KALDI_MEL_BREAK_HZ)
    mel_high = KALDI_MEL_SCALE * math.log(1.0 + high_hz / KALDI_MEL_BREAK_HZ)
    delta = (mel_high - mel_low) / (num_bins + 1)
    index = torch.arange(num_bins, device="cpu")[:, None]  # int64, promoted to float32 below
    left = mel_low + index * delta
    center = mel_low + (index + 1.0) * delta
    right = mel_low + (index + 2.0) * delta
    bin_hz = (sample_rate / padded_window) * torch.arange(
        float(padded_window // 2), device="cpu", dtype=torch.float32
    )
    mel = (KALDI_MEL_SCALE * (1.0 + bin_hz / KALDI_MEL_BREAK_HZ).log())[None, :]
    rising = (mel - left) / (center - left)
    falling = (right - mel) / (right - center)
    banks = torch.clamp(torch.minimum(rising, falling), min=0.0)
    return torch.nn.functional.pad(banks, (0, 1))  # Nyquist bin gets no weight


def hann_window(size: int) -> torch.Tensor:
    """Periodic Hann as torch computes it (float32), the window whisper and Matcha use."""
    return torch.hann_window(size, periodic=True, dtype=torch.float32, device="cpu")


def povey_window(size: int) -> torch.Tensor:
    """Kaldi's povey window: symmetric Hann ** 0.85, float32."""
    symmetric = torch.hann_window(size, periodic=False, dtype=torch.float32, device="cpu")
    return symmetric.pow(POVEY_POWER)
