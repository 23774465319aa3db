"""Prompt audio features: parity with upstream's arrays, the resampler, and input validation."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from shared.errors import InvalidRequestError, ModelLoadError
from workers.model.features import MelConfig, prompt_mel, whisper_log_mel
from workers.model.prompt_features import extract_prompt_features
from workers.model.resample import (
    resample,
    resampled_length,
    sinc_resample_kernel,
)
from workers.model.yaml_plain import load_plain_yaml
from workers.tools.reference.configs import mel_config_from_reference
from workers.tools.reference.features import check_features
from workers.tools.reference.parity import ArrayCheck, ReferenceSet


@pytest.fixture(scope="module")
def ref(reference_dir: Path) -> ReferenceSet:
    return ReferenceSet(reference_dir)


@pytest.fixture(scope="module")
def mel_config(ref: ReferenceSet) -> MelConfig:
    return mel_config_from_reference(ref.config)


def copy_set(ref: ReferenceSet, target: Path, *, frontend: bool = True) -> ReferenceSet:
    names = ["config.json", "mel_reference.npz"] + (["frontend_reference.npz"] * frontend)
    for name in names:
        shutil.copy(ref.root / name, target / name)
        (target / name).chmod(0o644)
    return ReferenceSet(target)


def failed(checks: list[ArrayCheck]) -> set[str]:
    return {c.name for c in checks if not c.passed}


def test_every_feature_array_matches_and_is_gated(ref: ReferenceSet) -> None:
    checks = check_features(ref)
    assert failed(checks) == set()
    assert all(c.gated for c in checks)  # our resampler's kernel is upstream's
    names = {c.name for c in checks}
    for expected in (
        "mel_reference.npz:mel1",
        "frontend_reference.npz:wav16k_2",
        "frontend_reference.npz:whisper_logmel128_1",
        "frontend_reference.npz:fbank80_2[nomean > -10]",
        "frontend_reference.npz:speech_feat_1",
        "frontend_reference.npz:whisper_logmel128_2[end to end]",
        "frontend_reference.npz:kaldi_mel_banks_80",
        "frontend_reference.npz:resample_kernel_16k",
    ):
        assert expected in names


def test_without_frontend_file_only_mel_rows(ref: ReferenceSet, tmp_path: Path) -> None:
    checks = check_features(copy_set(ref, tmp_path, frontend=False))
    assert checks and all(c.name.startswith("mel_reference.npz:") for c in checks)
    assert failed(checks) == set()


def test_perturbed_16k_signal_fails_whisper_and_fbank(ref: ReferenceSet, tmp_path: Path) -> None:
    copy = copy_set(ref, tmp_path)
    arrays = copy.arrays("frontend_reference.npz")
    noise = np.random.default_rng(0).normal(0, 1e-3, arrays["wav16k_1"].shape)
    arrays["wav16k_1"] = (arrays["wav16k_1"] + noise).astype(np.float32)
    np.savez(tmp_path / "frontend_reference.npz", **arrays)
    bad = failed(check_features(copy))
    assert "frontend_reference.npz:whisper_logmel128_1" in bad
    assert "frontend_reference.npz:fbank80_1[nomean > -10]" in bad
    assert "frontend_reference.npz:wav16k_1" in bad
    assert not any(name.endswith("_2") for name in bad)


def test_wrong_mel_config_fails_the_mel_rows(ref: ReferenceSet, tmp_path: Path) -> None:
    copy = copy_set(ref, tmp_path, frontend=False)
    config = json.loads((tmp_path / "config.json").read_text())
    config["common"]["feat_extractor_mel"]["fmax"] = 7600
    (tmp_path / "config.json").write_text(json.dumps(config))
    bad = failed(check_features(ReferenceSet(copy.root)))
    assert {"mel_reference.npz:mel1[> -9]", "mel_reference.npz:mel_filterbank"} <= bad


def test_stored_kernel_mismatch_ungates_end_to_end_rows(ref: ReferenceSet, tmp_path: Path) -> None:
    copy = copy_set(ref, tmp_path)
    arrays = copy.arrays("frontend_reference.npz")
    arrays["resample_kernel_16k"] = arrays["resample_kernel_16k"] * np.float32(1.001)
    np.savez(tmp_path / "frontend_reference.npz", **arrays)
    checks = {c.name: c for c in check_features(copy)}
    assert not checks["frontend_reference.npz:resample_kernel_16k"].passed
    assert not checks["frontend_reference.npz:whisper_logmel128_1[end to end]"].gated
    assert checks["frontend_reference.npz:speech_feat_1[end to end]"].gated  # 24 kHz: direct


@pytest.mark.parametrize(
    ("rates", "shape", "width"),
    [((22050, 16000), (320, 1, 459), 9), ((22050, 24000), (160, 1, 161), 7)],
)
def test_kernel_shapes_match_the_readme_table(
    rates: tuple[int, int], shape: tuple[int, ...], width: int
) -> None:
    kernel, got_width = sinc_resample_kernel(*rates)
    assert tuple(kernel.shape) == shape and got_width == width


def test_float32_phase_offset_is_reproduced() -> None:
    """README: for 22050 -> 16000 the float32 offset moves the kernel by up to 7.4e-6."""
    kernel, width = sinc_resample_kernel(22050, 16000)
    orig, new, base = 441, 320, 0.99 * 320
    taps = np.arange(-width, width + orig, dtype=np.float64)[None, :] / orig
    t = np.clip((-np.arange(new, dtype=np.float64)[:, None] / new + taps) * base, -6, 6)
    window = np.cos(t * math.pi / 12) ** 2
    t = t * math.pi
    with np.errstate(invalid="ignore", divide="ignore"):
        exact = np.where(t == 0, 1.0, np.sin(t) / t) * window * (base / orig)
    shift = float(np.abs(kernel.numpy()[:, 0, :] - exact).max())
    assert 5e-6 < shift < 1e-5


def test_resample_keeps_a_passband_tone_and_lengths() -> None:
    t = torch.arange(48000, dtype=torch.float64) / 48000
    tone = (0.5 * torch.sin(2 * math.pi * 1000 * t)).float()[None]
    out = resample(tone, 48000, 16000)
    assert out.shape == (1, 16000)
    assert abs(float(out[0, 2000:14000].abs().max()) - 0.5) < 5e-3
    assert resampled_length(25000, 24000, 16000) == 16667
    assert resample(tone, 16000, 16000) is tone
    with pytest.raises(ValueError, match="positive"):
        resample(tone, 0, 16000)


def test_whisper_clamp_is_per_utterance() -> None:
    gen = torch.Generator().manual_seed(0)
    loud = torch.randn(1, 3200, generator=gen)
    quiet = torch.randn(1, 3200, generator=gen) * 1e-3
    batch, lengths = whisper_log_mel(torch.cat([loud, quiet]))
    single, _ = whisper_log_mel(quiet)
    assert torch.equal(batch[1:], single) and lengths.tolist() == [20, 20]
    assert lengths.dtype == torch.int32


def test_prompt_features_average_channels(mel_config: MelConfig) -> None:
    gen = torch.Generator().manual_seed(1)
    stereo = torch.randn(2, 24000, generator=gen) * 0.1
    both = extract_prompt_features(stereo.numpy(), 24000, mel_config)
    mono = extract_prompt_features(stereo.mean(0).numpy(), 24000, mel_config)
    assert torch.equal(both.speech_feat, mono.speech_feat)
    assert both.tokenizer_feats.shape == (1, 128, 100)
    assert both.speaker_fbank.shape == (1, 98, 80)
    assert both.speech_feat.shape == (1, 50, 80)
    assert both.tokenizer_feats_length.tolist() == [100]


@pytest.mark.parametrize(
    ("samples", "rate", "message"),
    [
        (np.zeros(8000, np.float32), 8000, "sample rate 8000 Hz is below 16000"),
        (np.zeros(16000 * 31, np.float32), 16000, "longer than the 30 s"),
        (np.zeros(300, np.float32), 16000, "too short"),
        (np.full(16000, np.nan, np.float32), 16000, "NaN"),
        (np.zeros(16000, np.int16), 16000, "float samples"),
        (np.zeros((1, 2, 16000), np.float32), 16000, "channels, samples"),
    ],
)
def test_bad_prompt_audio_is_a_clear_invalid_request(
    mel_config: MelConfig, samples: np.ndarray, rate: int, message: str
) -> None:
    with pytest.raises(InvalidRequestError, match=message):
        extract_prompt_features(samples, rate, mel_config)


def test_mel_config_from_yaml(published_yaml: Path, mel_config: MelConfig) -> None:
    assert MelConfig.from_model_yaml(load_plain_yaml(published_yaml)) == mel_config
    text = published_yaml.read_text()
    assert text.count("    hop_size: 480\n") == 1
    published_yaml.write_text(text.replace("    hop_size: 480\n", ""))
    with pytest.raises(ModelLoadError, match="hop_size"):
        MelConfig.from_model_yaml(load_plain_yaml(published_yaml))


def test_prompt_mel_frame_count(mel_config: MelConfig) -> None:
    wav = torch.zeros(1, 24000 + 479)
    assert prompt_mel(wav, mel_config).shape == (1, 80, 50)
