"""Prompt recording -> the exact tensors upstream's front end computes from it.

Mirrors upstream's `load_wav(path, target_sr)` for each target: channels averaged, resampled
from the ORIGINAL rate with the sinc filter of `resample` (16 kHz for the two prompt models,
24 kHz for the prompt mel; nothing is resampled twice), no trimming, padding or normalisation.
Returns the ONNX inputs (`speech_tokenizer_v2`: feats + feats_length; `campplus`: fbank) and the
untrimmed time-major prompt mel. Running the ONNX models and the 1:2 trimming are the caller's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from shared.errors import InvalidRequestError
from workers.model.features import (
    KALDI_FRAME,
    WHISPER_SAMPLE_RATE,
    MelConfig,
    prompt_mel,
    speaker_fbank,
    whisper_log_mel,
)
from workers.model.resample import resample, resampled_length

PROMPT_MODELS_SAMPLE_RATE = WHISPER_SAMPLE_RATE  # == KALDI_SAMPLE_RATE: both take 16 kHz
MIN_PROMPT_SAMPLE_RATE = 16000  # upstream asserts the file rate is at least 16 kHz
MAX_TOKENIZER_SECONDS = 30.0  # upstream asserts at most 30 s for the speech tokenizer


@dataclass(frozen=True)
class PromptFeatures:
    """Everything the prompt models and the flow need from one recording (float32 unless noted).

    wav16k (1, N16), wav24k (1, N24); tokenizer_feats (1, 128, N16 // 160) and
    tokenizer_feats_length (1,) int32: speech_tokenizer_v2.onnx inputs 0 and 1;
    speaker_fbank (1, T, 80): campplus.onnx input; speech_feat (1, N24 // 480, 80): prompt mel.
    """

    wav16k: torch.Tensor
    wav24k: torch.Tensor
    tokenizer_feats: torch.Tensor
    tokenizer_feats_length: torch.Tensor
    speaker_fbank: torch.Tensor
    speech_feat: torch.Tensor


def as_mono(samples: np.ndarray | torch.Tensor) -> torch.Tensor:
    """(N,) or (channels, N) float samples -> (1, N) float32, channels averaged."""
    wav = torch.as_tensor(samples)
    if wav.ndim == 1:
        wav = wav[None]
    if wav.ndim != 2 or wav.shape[-1] == 0:
        raise InvalidRequestError(
            f"prompt audio: expected (samples,) or (channels, samples), got {tuple(wav.shape)}"
        )
    if not torch.is_floating_point(wav):
        raise InvalidRequestError(f"prompt audio: expected float samples, got {wav.dtype}")
    wav = wav.to(torch.float32)
    if not torch.isfinite(wav).all():
        raise InvalidRequestError("prompt audio: contains NaN or infinite samples")
    return wav.mean(dim=0, keepdim=True)


def _check_lengths(
    num_samples: int, sample_rate: int, mel: MelConfig, max_tokenizer_seconds: float
) -> None:
    if sample_rate < MIN_PROMPT_SAMPLE_RATE:
        raise InvalidRequestError(
            f"prompt audio: sample rate {sample_rate} Hz is below {MIN_PROMPT_SAMPLE_RATE} Hz"
        )
    n16 = resampled_length(num_samples, sample_rate, PROMPT_MODELS_SAMPLE_RATE)
    n24 = resampled_length(num_samples, sample_rate, mel.sampling_rate)
    if n16 > max_tokenizer_seconds * PROMPT_MODELS_SAMPLE_RATE:
        raise InvalidRequestError(
            f"prompt audio: {n16 / PROMPT_MODELS_SAMPLE_RATE:.2f} s is longer than the "
            f"{max_tokenizer_seconds:g} s the speech tokenizer accepts"
        )
    if n16 < KALDI_FRAME or n24 <= max(mel.reflect_pad, mel.hop_size):
        raise InvalidRequestError(
            f"prompt audio: {num_samples / sample_rate:.3f} s is too short for one feature frame"
        )


def extract_prompt_features(
    samples: np.ndarray | torch.Tensor,
    sample_rate: int,
    mel_config: MelConfig,
    *,
    max_tokenizer_seconds: float = MAX_TOKENIZER_SECONDS,
) -> PromptFeatures:
    """Recording at any rate >= 16 kHz -> `PromptFeatures`; InvalidRequestError on bad input."""
    wav = as_mono(samples)
    _check_lengths(wav.shape[-1], sample_rate, mel_config, max_tokenizer_seconds)
    wav16k = resample(wav, sample_rate, PROMPT_MODELS_SAMPLE_RATE)
    wav24k = resample(wav, sample_rate, mel_config.sampling_rate)
    feats, feats_length = whisper_log_mel(wav16k)
    return PromptFeatures(
        wav16k=wav16k,
        wav24k=wav24k,
        tokenizer_feats=feats,
        tokenizer_feats_length=feats_length,
        speaker_fbank=speaker_fbank(wav16k),
        speech_feat=prompt_mel(wav24k, mel_config).transpose(1, 2),
    )
