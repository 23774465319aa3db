"""Band-limited resampling identical to the filter upstream's front end uses.

Upstream resamples prompt audio with torchaudio's `Resample` defaults (windowed-sinc with a
Hann-squared window, 6 zero crossings, roll-off 0.99). We build that same polyphase filter
ourselves, including its one float32 quirk: the per-phase offset j/n is computed in float32
before being added to the float64 tap grid. With it reproduced, our output matches upstream's
to float32 rounding (bitwise on the reference signals), which a different resampler (soxr, a
Kaiser polyphase design) cannot: this filter's stopband is weak and lets aliases through that
the downstream log features are sensitive to.

Rates are reduced by their gcd, so 24000 -> 16000 is 3 -> 2 (a (2, 1, 23) kernel, width 10).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

LOWPASS_FILTER_WIDTH = 6  # zero crossings of the sinc on each side
ROLLOFF = 0.99  # cutoff as a fraction of the lower Nyquist rate
KERNEL_CACHE_SIZE = 16  # distinct (from, to) rate pairs kept per process


@lru_cache(maxsize=KERNEL_CACHE_SIZE)
def _kernel_f64(orig: int, new: int) -> tuple[np.ndarray, int]:
    base = min(orig, new) * ROLLOFF
    width = math.ceil(LOWPASS_FILTER_WIDTH * orig / base)
    taps = np.arange(-width, width + orig, dtype=np.float64)[None, :] / orig
    phase = np.arange(0, -new, -1, dtype=np.int64).astype(np.float32) / np.float32(new)
    t = (phase.astype(np.float64)[:, None] + taps) * base
    t = np.clip(t, -LOWPASS_FILTER_WIDTH, LOWPASS_FILTER_WIDTH)
    window = np.cos(t * math.pi / LOWPASS_FILTER_WIDTH / 2) ** 2
    t = t * math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        sinc = np.where(t == 0, 1.0, np.sin(t) / t)
    kernel = sinc * (window * (base / orig))
    return kernel[:, None, :], width


def reduced_rates(orig_rate: int, new_rate: int) -> tuple[int, int]:
    """Both rates divided by their gcd: (24000, 16000) -> (3, 2)."""
    divisor = math.gcd(int(orig_rate), int(new_rate))
    return int(orig_rate) // divisor, int(new_rate) // divisor


def sinc_resample_kernel(orig_rate: int, new_rate: int) -> tuple[torch.Tensor, int]:
    """(n, 1, 2·width + o) float32 polyphase kernel (one row per output phase) and width."""
    orig, new = reduced_rates(orig_rate, new_rate)
    kernel, width = _kernel_f64(orig, new)
    return torch.from_numpy(kernel.astype(np.float32)), width


def resampled_length(num_samples: int, orig_rate: int, new_rate: int) -> int:
    """⌈n·N / o⌉ samples, with the ratio rounded to float32 first as upstream does."""
    orig, new = reduced_rates(orig_rate, new_rate)
    return math.ceil(float(np.float32(new * num_samples / orig)))


def resample(signal: torch.Tensor, orig_rate: int, new_rate: int) -> torch.Tensor:
    """signal: (..., N) float32 -> (..., ⌈N·new/orig⌉); returned unchanged if rates are equal."""
    if orig_rate <= 0 or new_rate <= 0:
        raise ValueError(f"sample rates must be positive, got {orig_rate} -> {new_rate}")
    if orig_rate == new_rate:
        return signal
    orig, _ = reduced_rates(orig_rate, new_rate)
    kernel, width = sinc_resample_kernel(orig_rate, new_rate)
    shape = signal.shape
    flat = signal.reshape(-1, shape[-1])
    padded = F.pad(flat, (width, width + orig))
    phases = F.conv1d(padded[:, None, :], kernel.to(signal.device, signal.dtype), stride=orig)
    out = phases.transpose(1, 2).reshape(flat.shape[0], -1)  # interleave the n phases
    out = out[:, : resampled_length(shape[-1], orig_rate, new_rate)]
    return out.reshape(*shape[:-1], out.shape[-1])
