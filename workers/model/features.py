"""The three audio features CosyVoice 2 computes from a prompt recording, in plain torch.

- `prompt_mel`: the 24 kHz 80-bin log-mel the flow is conditioned on (Matcha's
  `mel_spectrogram`; parameters from the model directory, `MelConfig`).
- `whisper_log_mel`: the 16 kHz 128-bin log-mel `speech_tokenizer_v2.onnx` takes (openai-whisper's
  `log_mel_spectrogram` with n_mels=128 and no padding).
- `kaldi_fbank`: the 16 kHz 80-bin Kaldi filterbank `campplus.onnx` takes (torchaudio's
  `compliance.kaldi.fbank` with dither 0), then mean-subtracted per bin by `speaker_fbank`.

Each follows its original's order of float32 operations; on the reference signals all three
agree with upstream's arrays far inside the README's tolerances. The whisper and Kaldi settings
are constants of those two ONNX models, not of the model directory's yaml.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F

from shared.errors import ModelLoadError
from workers.model.mel_filters import (
    hann_window,
    kaldi_mel_banks,
    povey_window,
    slaney_mel_filterbank,
)

MEL_MAGNITUDE_EPS = 1e-9  # Matcha: sqrt(re² + im² + 1e-9)
MEL_LOG_FLOOR = 1e-5  # Matcha: ln(max(x, 1e-5))

WHISPER_SAMPLE_RATE = 16000
WHISPER_N_FFT = 400  # 25 ms at 16 kHz
WHISPER_HOP = 160  # 10 ms: 100 frames per second
WHISPER_N_MELS = 128  # speech_tokenizer_v2 uses whisper-large-v3's 128 bands
WHISPER_LOG_FLOOR = 1e-10
WHISPER_DYNAMIC_RANGE = 8.0  # log10 units kept below the utterance's maximum

KALDI_SAMPLE_RATE = 16000
KALDI_FRAME = 400  # 25 ms at 16 kHz
KALDI_SHIFT = 160  # 10 ms
KALDI_PADDED_FRAME = 512  # next power of two of the frame
KALDI_PREEMPHASIS = 0.97
KALDI_N_MELS = 80
KALDI_LOW_HZ = 20.0
KALDI_HIGH_HZ = 0.0  # <= 0: offset from Nyquist, i.e. 8000 Hz
KALDI_LOG_FLOOR = torch.finfo(torch.float32).eps  # 1.1920929e-07


@dataclass(frozen=True)
class MelConfig:
    """Matcha `mel_spectrogram` parameters of the prompt mel (yaml `feat_extractor`)."""

    n_fft: int
    num_mels: int
    sampling_rate: int
    hop_size: int
    win_size: int
    fmin: float
    fmax: float | None
    center: bool

    @classmethod
    def from_model_yaml(cls, doc: Mapping[str, Any]) -> MelConfig:
        """From the plain-data `cosyvoice2.yaml` (`feat_extractor`)."""
        try:
            return mel_config_from_fields(doc["feat_extractor"])
        except (KeyError, TypeError) as e:
            raise ModelLoadError(f"cosyvoice2.yaml: feat_extractor key missing: {e}") from e

    @property
    def reflect_pad(self) -> int:
        """Samples reflected on each side before the STFT: (1920 − 480) / 2 = 720."""
        return (self.n_fft - self.hop_size) // 2


def mel_config_from_fields(src: Mapping[str, Any]) -> MelConfig:
    """A `MelConfig` from Matcha's `mel_spectrogram` keyword names (`n_fft`, ..., `center`).

    A missing field raises `KeyError`; the caller names the section it read.
    """
    fmax = src["fmax"]
    return MelConfig(
        n_fft=int(src["n_fft"]),
        num_mels=int(src["num_mels"]),
        sampling_rate=int(src["sampling_rate"]),
        hop_size=int(src["hop_size"]),
        win_size=int(src["win_size"]),
        fmin=float(src["fmin"]),
        fmax=None if fmax is None else float(fmax),
        center=bool(src["center"]),
    )


@lru_cache(maxsize=8)
def _slaney_basis(
    sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float | None
) -> torch.Tensor:
    return torch.from_numpy(slaney_mel_filterbank(sample_rate, n_fft, n_mels, fmin, fmax))


def prompt_mel(wav: torch.Tensor, config: MelConfig) -> torch.Tensor:
    """wav: (B, N) float32 at config.sampling_rate -> log-mel (B, num_mels, N // hop)."""
    pad = config.reflect_pad
    padded = F.pad(wav[:, None, :], (pad, pad), mode="reflect")[:, 0, :]
    spec = torch.stft(
        padded,
        config.n_fft,
        hop_length=config.hop_size,
        win_length=config.win_size,
        window=hann_window(config.win_size).to(wav.device),
        center=config.center,
        pad_mode="reflect",
        normalized=False,
        onesided=True,
        return_complex=True,
    )
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + MEL_MAGNITUDE_EPS)
    basis = _slaney_basis(
        config.sampling_rate, config.n_fft, config.num_mels, config.fmin, config.fmax
    )
    mel = torch.matmul(basis.to(wav.device), magnitude)
    return torch.log(torch.clamp(mel, min=MEL_LOG_FLOOR))


def whisper_log_mel(wav16k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """wav16k: (B, N) float32 -> (feats (B, 128, N // 160), feats_length int32 (B,)).

    The dynamic-range clamp uses each utterance's own maximum (whisper's global max for B=1).
    """
    spec = torch.stft(
        wav16k,
        WHISPER_N_FFT,
        WHISPER_HOP,
        window=hann_window(WHISPER_N_FFT).to(wav16k.device),
        center=True,
        pad_mode="reflect",
        return_complex=True,
    )
    power = spec[..., :-1].abs() ** 2  # whisper drops the last frame
    basis = _slaney_basis(WHISPER_SAMPLE_RATE, WHISPER_N_FFT, WHISPER_N_MELS, 0.0, None)
    log_spec = torch.clamp(basis.to(wav16k.device) @ power, min=WHISPER_LOG_FLOOR).log10()
    peak = log_spec.amax(dim=(1, 2), keepdim=True)
    log_spec = torch.maximum(log_spec, peak - WHISPER_DYNAMIC_RANGE)
    feats = (log_spec + 4.0) / 4.0
    lengths = torch.full((wav16k.shape[0],), feats.shape[-1], dtype=torch.int32)
    return feats, lengths


def kaldi_fbank(wav16k: torch.Tensor) -> torch.Tensor:
    """wav16k: (N,) float32 -> ln mel energies (1 + (N − 400) // 160, 80), no mean removal."""
    frames = wav16k.unfold(0, KALDI_FRAME, KALDI_SHIFT)  # snip_edges: whole frames only
    frames = frames - frames.mean(dim=1, keepdim=True)  # remove DC per frame
    previous = F.pad(frames[None], (1, 0), mode="replicate")[0, :, :-1]
    frames = frames - KALDI_PREEMPHASIS * previous
    frames = frames * povey_window(KALDI_FRAME).to(frames.device)
    frames = F.pad(frames, (0, KALDI_PADDED_FRAME - KALDI_FRAME))
    power = torch.fft.rfft(frames).abs().pow(2.0)
    banks = kaldi_filterbank().to(frames.device)
    energies = torch.mm(power, banks.T)
    return torch.clamp(energies, min=KALDI_LOG_FLOOR).log()


@lru_cache(maxsize=1)
def kaldi_filterbank() -> torch.Tensor:
    """The (80, 257) float32 triangles `kaldi_fbank` applies (cached; do not modify)."""
    return kaldi_mel_banks(
        KALDI_N_MELS, KALDI_PADDED_FRAME, KALDI_SAMPLE_RATE, KALDI_LOW_HZ, KALDI_HIGH_HZ
    )


def speaker_fbank(wav16k: torch.Tensor) -> torch.Tensor:
    """wav16k: (1, N) float32 -> CAM++ input (1, T, 80): fbank minus its per-bin mean."""
    feats = kaldi_fbank(wav16k[0])
    return (feats - feats.mean(dim=0, keepdim=True))[None]
