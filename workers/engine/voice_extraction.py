"""Prompt recording -> the engine's `VoicePrompt` (speech tokens, mel, embedding, transcript).

Steps: the shared prompt rules (rate >= 16 kHz, length, not silent; `shared.voices`), upstream's
features (`prompt_features`: 16 kHz whisper log-mel and Kaldi fbank, 24 kHz prompt mel), the two
ONNX models, then the 1:2 trimming: the flow needs exactly two mel frames per prompt token, so
both are cut to n = min(mel frames // 2, tokens) tokens and 2n frames (the same trimmed tokens
feed the LLM and the flow; the speaker embedding feeds the flow).
"""

from __future__ import annotations

import numpy as np

from shared.errors import ModelLoadError, PromptAudioError
from shared.voices import check_prompt_audio
from workers.engine.api import VoicePrompt
from workers.engine.prompt_models import PromptModels
from workers.model.features import MelConfig
from workers.model.prompt_features import MAX_TOKENIZER_SECONDS, extract_prompt_features


def trim_one_to_two(tokens: np.ndarray, mel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """tokens (n_tok,), mel (T, 80) -> (n,), (2n, 80) with n = min(T // 2, n_tok)."""
    n = min(mel.shape[0] // 2, tokens.shape[0])
    return tokens[:n], mel[: 2 * n]


def mono(samples: np.ndarray) -> np.ndarray:
    """(N,) or (channels, N) -> (N,) float32, channels averaged."""
    array = np.asarray(samples, dtype=np.float32)
    if array.ndim == 2:
        array = array.mean(axis=0, dtype=np.float32)
    if array.ndim != 1:
        raise PromptAudioError(
            f"prompt audio: expected (samples,) or (channels, samples), got {array.shape}"
        )
    return array


class VoiceExtractor:
    """Runs the prompt rules, the features and the ONNX models for one recording at a time."""

    def __init__(
        self,
        models: PromptModels,
        mel_config: MelConfig,
        *,
        speech_vocab: int,
        max_seconds: float = MAX_TOKENIZER_SECONDS,
    ) -> None:
        self.models = models
        self.mel_config = mel_config
        self.speech_vocab = speech_vocab
        # The speech tokenizer's own limit holds whatever the setting says.
        self.max_seconds = min(max_seconds, MAX_TOKENIZER_SECONDS)

    def extract(self, samples: np.ndarray, sample_rate: int, transcript: str) -> VoicePrompt:
        """Mono (or multi-channel) float samples at any rate >= 16 kHz -> trimmed VoicePrompt."""
        wav = mono(samples)
        check_prompt_audio(wav, sample_rate, self.max_seconds)
        features = extract_prompt_features(
            wav, sample_rate, self.mel_config, max_tokenizer_seconds=self.max_seconds
        )
        tokens = self.models.speech_tokens(
            features.tokenizer_feats.numpy(), features.tokenizer_feats_length.numpy()
        )
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.speech_vocab):
            raise ModelLoadError(
                f"speech tokenizer returned ids outside [0, {self.speech_vocab}): "
                "the ONNX file does not belong to this model"
            )
        embedding = self.models.speaker_embedding(features.speaker_fbank.numpy())
        tokens, mel = trim_one_to_two(tokens, features.speech_feat[0].numpy())
        if tokens.size == 0:
            raise PromptAudioError("prompt audio: too short for one speech token")
        return VoicePrompt(
            speech_tokens=np.ascontiguousarray(tokens, dtype=np.int32),
            mel=np.ascontiguousarray(mel, dtype=np.float32),
            embedding=np.ascontiguousarray(embedding, dtype=np.float32),
            transcript=transcript.strip(),
        )
