"""Prompt side: the shared prompt rules, ONNX prompt models, 1:2 trimming, voice extraction."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile

from shared.errors import (
    InvalidRequestError,
    ModelLoadError,
    PromptAudioError,
    PromptSampleRateError,
    PromptSilentError,
    PromptTooLongError,
)
from shared.voices import check_prompt_audio
from workers.engine.prompt_models import (
    COREML_PROVIDER,
    CPU_PROVIDER,
    OnnxModel,
    PromptModels,
    onnx_providers,
)
from workers.engine.voice_extraction import trim_one_to_two


def tone(seconds: float, rate: int, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * 180 * t)).astype(np.float32)


@pytest.fixture(scope="module")
def prompt(tiny_model_dir: Path) -> tuple[np.ndarray, int]:
    samples, rate = soundfile.read(tiny_model_dir / "prompt.wav", dtype="float32")
    return samples, int(rate)


def test_providers_core_ml_on_macos_only_when_built_in() -> None:
    assert onnx_providers("Darwin", [COREML_PROVIDER, CPU_PROVIDER]) == [
        COREML_PROVIDER,
        CPU_PROVIDER,
    ]
    assert onnx_providers("Darwin", [CPU_PROVIDER]) == [CPU_PROVIDER]
    assert onnx_providers("Linux", [COREML_PROVIDER, CPU_PROVIDER]) == [CPU_PROVIDER]
    assert onnx_providers() == [CPU_PROVIDER]  # this Linux machine


def test_prompt_models_shapes(tiny_model_dir: Path) -> None:
    models = PromptModels(tiny_model_dir)
    feats = np.random.default_rng(0).standard_normal((1, 128, 101)).astype(np.float32)
    tokens = models.speech_tokens(feats, np.array([101], dtype=np.int32))
    assert tokens.dtype == np.int32 and tokens.shape == (26,)  # ceil(101 / 4)
    fbank = np.zeros((1, 98, 80), dtype=np.float32)
    embedding = models.speaker_embedding(fbank)
    assert embedding.dtype == np.float32 and embedding.shape == (192,)


def test_onnx_model_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"campplus\.onnx: file missing"):
        OnnxModel(tmp_path / "campplus.onnx")
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match=r"broken\.onnx: onnxruntime cannot load it"):
        OnnxModel(broken).run(np.zeros(1, dtype=np.float32))


def test_trim_one_to_two_worked_numbers() -> None:
    """The reference README's set b: 33 tokens, 65 mel frames -> 32 tokens, 64 frames."""
    tokens, mel = trim_one_to_two(np.arange(33), np.zeros((65, 80)))
    assert tokens.shape == (32,) and mel.shape == (64, 80)
    tokens, mel = trim_one_to_two(np.arange(25), np.zeros((50, 80)))  # set 1: nothing trimmed
    assert tokens.shape == (25,) and mel.shape == (50, 80)
    tokens, mel = trim_one_to_two(np.arange(20), np.zeros((50, 80)))  # fewer tokens than frames
    assert tokens.shape == (20,) and mel.shape == (40, 80)


def test_extract_voice_from_the_tiny_prompt(tiny_engine, prompt: tuple[np.ndarray, int]) -> None:
    samples, rate = prompt
    voice = tiny_engine.extract_voice(samples, rate, "  A transcript.  ")
    assert voice.speech_tokens.dtype == np.int32 and voice.speech_tokens.shape == (50,)
    assert voice.mel.shape == (100, 80) and voice.mel.dtype == np.float32
    assert voice.embedding.shape == (192,)
    assert voice.transcript == "A transcript."
    again = tiny_engine.extract_voice(np.stack([samples, samples]), rate, "A transcript.")
    assert np.array_equal(again.speech_tokens, voice.speech_tokens)  # channels averaged


def test_extract_voice_resamples_any_rate(tiny_engine) -> None:
    voice = tiny_engine.extract_voice(tone(1.0, 44100), 44100, "")
    assert voice.speech_tokens.shape == (25,) and voice.mel.shape == (50, 80)


@pytest.mark.parametrize(
    ("samples", "rate", "error", "message"),
    [
        (tone(1.0, 8000), 8000, PromptSampleRateError, "8000 Hz, need at least 16000 Hz"),
        (tone(31.0, 16000), 16000, PromptTooLongError, "31.0 s, limit 30 s"),
        (np.zeros(24000, dtype=np.float32), 24000, PromptSilentError, "digital silence"),
        (tone(1.0, 24000, 1e-4), 24000, PromptSilentError, "RMS -83 dBFS"),
        (np.full(24000, 0.5, np.float32), 24000, PromptSilentError, r"DC \+0\.50 of full"),
        (np.full(24000, -0.9, np.float32) + tone(1.0, 24000, 1e-4), 24000, PromptSilentError, "DC"),
        (tone(0.2, 24000), 24000, PromptAudioError, "0.20 s, need at least 0.5 s"),
    ],
)
def test_bad_prompt_audio(
    tiny_engine, samples: np.ndarray, rate: int, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message) as caught:
        tiny_engine.extract_voice(samples, rate, "")
    assert isinstance(caught.value, InvalidRequestError)  # permanent: never retried


def test_prompt_limit_comes_from_the_caller() -> None:
    check_prompt_audio(tone(5.0, 16000), 16000, max_seconds=10)
    with pytest.raises(PromptTooLongError, match=r"5\.0 s, limit 4 s"):
        check_prompt_audio(tone(5.0, 16000), 16000, max_seconds=4)
    nan = tone(1.0, 16000)
    nan[5] = np.nan
    with pytest.raises(PromptAudioError, match="NaN"):
        check_prompt_audio(nan, 16000, max_seconds=10)
