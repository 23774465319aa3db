"""HiFT vocoder: parity with the reference set, loading, determinism, Core-ML-friendly rewrites."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from shared.errors import ModelLoadError
from workers.model.checkpoint import read_state_dict
from workers.model.hift.config import HiFTConfig
from workers.model.hift.istft import ConvISTFT, SourceSTFT, torch_istft
from workers.model.hift.layers import fold_weight_norm
from workers.model.hift.model import HiFTGenerator, build_hift, normalize_hift_keys
from workers.model.hift.source import draw_source_noise, sine_waves_audio_rate
from workers.model.yaml_plain import load_plain_yaml
from workers.tools.bench.hift_stage import bench_hift
from workers.tools.reference.configs import hift_config_from_reference
from workers.tools.reference.hift import check_hift, check_hift_full_keys
from workers.tools.reference.parity import ArrayCheck, ReferenceSet

WEIGHT_NORMED_CONVS = 82  # README: conv_pre, 3 ups, 9+3 resblocks x 6, conv_post, 5 f0 convs


@pytest.fixture(scope="module")
def ref(reference_dir: Path) -> ReferenceSet:
    return ReferenceSet(reference_dir)


@pytest.fixture(scope="module")
def tiny_config(ref: ReferenceSet) -> HiFTConfig:
    return hift_config_from_reference(ref.config, "tiny")


@pytest.fixture(scope="module")
def tiny_state(ref: ReferenceSet) -> dict[str, torch.Tensor]:
    return read_state_dict(ref.checkpoint("hift"))


def copy_set(ref: ReferenceSet, target: Path) -> ReferenceSet:
    for name in ("config.json", "hift.pt", "hift_reference.npz"):
        shutil.copy(ref.root / name, target / name)
        (target / name).chmod(0o644)
    return ReferenceSet(target)


def failed(checks: list[ArrayCheck]) -> set[str]:
    return {c.name for c in checks if not c.passed}


def test_every_reference_array_matches(ref: ReferenceSet) -> None:
    checks = check_hift(ref)
    assert failed(checks) == set()
    names = {c.name.split("[")[0] for c in checks}
    expected = {"f0", "wav_fixed", "infer_source", "infer_wav", "infer_uv", "infer_rand_ini"}
    assert {f"hift_reference.npz:{n}" for n in expected} <= names
    assert {"infer_sinegen_noise", "infer_f0_upsampled"} <= {n.split(":")[1] for n in names}


def test_full_size_keys_match_both_weight_norm_styles(ref: ReferenceSet) -> None:
    assert check_hift_full_keys(ref) == []


def test_full_key_check_reports_a_difference(ref: ReferenceSet, tmp_path: Path) -> None:
    for name in ("config.json", "keys-hift.txt"):
        shutil.copy(ref.root / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    config["full"]["hift"]["base_channels"] = 256
    (tmp_path / "config.json").write_text(json.dumps(config))
    problems = check_hift_full_keys(ReferenceSet(tmp_path))
    assert problems and any("conv_pre" in p for p in problems)


def test_perturbed_weight_fails_the_waveform_checks(ref: ReferenceSet, tmp_path: Path) -> None:
    copy = copy_set(ref, tmp_path)
    state = read_state_dict(copy.checkpoint("hift"), mmap=False)
    key = "resblocks.4.convs1.1.parametrizations.weight.original0"  # g: v's scale cancels
    state[key] = state[key] * 2.0
    torch.save(state, copy.checkpoint("hift"))
    bad = failed(check_hift(copy))
    assert "hift_reference.npz:wav_fixed" in bad and "hift_reference.npz:infer_wav" in bad
    assert "hift_reference.npz:f0" not in bad  # the f0 predictor was not touched


def test_perturbed_f0_predictor_fails_f0_and_source(ref: ReferenceSet, tmp_path: Path) -> None:
    copy = copy_set(ref, tmp_path)
    state = read_state_dict(copy.checkpoint("hift"), mmap=False)
    state["f0_predictor.classifier.bias"] = state["f0_predictor.classifier.bias"] + 0.5
    torch.save(state, copy.checkpoint("hift"))
    bad = failed(check_hift(copy))
    assert {"hift_reference.npz:f0", "hift_reference.npz:infer_source"} <= bad


def test_perturbed_input_fails(ref: ReferenceSet, tmp_path: Path) -> None:
    copy = copy_set(ref, tmp_path)
    arrays = copy.arrays("hift_reference.npz")
    arrays["s_fixed"] = arrays["s_fixed"] + np.float32(1e-3)
    np.savez(tmp_path / "hift_reference.npz", **arrays)
    assert "hift_reference.npz:wav_fixed" in failed(check_hift(copy))


def _legacy(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    renames = {
        ".parametrizations.weight.original0": ".weight_g",
        ".parametrizations.weight.original1": ".weight_v",
    }
    out = {}
    for key, value in state.items():
        name = key
        for current, legacy in renames.items():
            name = name.replace(current, legacy)
        out[name] = value
    return out


def test_both_key_styles_and_generator_prefix_give_bitwise_equal_output(
    tiny_config: HiFTConfig, tiny_state: dict[str, torch.Tensor]
) -> None:
    variants = {
        "current": tiny_state,
        "legacy": _legacy(tiny_state),
        "prefixed": {f"generator.{k}": v for k, v in tiny_state.items()},
        "legacy+prefixed": {f"generator.{k}": v for k, v in _legacy(tiny_state).items()},
    }
    assert any(k.endswith("weight_g") for k in variants["legacy"])
    mel = torch.randn(1, 80, 12, generator=torch.Generator().manual_seed(3))
    noise = draw_source_noise(1, 9, 12 * 480, generator=torch.Generator().manual_seed(4))
    outputs = {
        name: build_hift(tiny_config, state).inference(mel, noise=noise).wav
        for name, state in variants.items()
    }
    for name, wav in outputs.items():
        assert torch.equal(wav, outputs["current"]), name


def test_missing_key_error_names_file_and_key(
    tiny_config: HiFTConfig, tiny_state: dict[str, torch.Tensor]
) -> None:
    state = dict(tiny_state)
    del state["conv_post.bias"]
    with pytest.raises(ModelLoadError, match=r"my/hift\.pt.*missing.*conv_post\.bias"):
        build_hift(tiny_config, state, source="my/hift.pt")


def test_wrong_shape_and_extra_key_errors_name_them(
    tiny_config: HiFTConfig, tiny_state: dict[str, torch.Tensor]
) -> None:
    state = dict(tiny_state)
    state["m_source.l_linear.weight"] = torch.zeros(1, 8)
    state["decoder.extra"] = torch.zeros(1)
    with pytest.raises(ModelLoadError) as info:
        build_hift(tiny_config, state, source="hift.pt")
    message = str(info.value)
    assert "m_source.l_linear.weight (1, 8) != (1, 9)" in message
    assert "unexpected" in message and "decoder.extra" in message


def test_both_styles_in_one_file_is_a_clear_error(
    tiny_config: HiFTConfig, tiny_state: dict[str, torch.Tensor]
) -> None:
    state = {
        **tiny_state,
        "conv_pre.weight_g": tiny_state["conv_pre.parametrizations.weight.original0"],
    }
    with pytest.raises(ModelLoadError, match=r"conv_pre\.parametrizations\.weight\.original0"):
        build_hift(tiny_config, state)


def test_seeded_generator_is_deterministic(
    tiny_config: HiFTConfig, tiny_state: dict[str, torch.Tensor]
) -> None:
    model = build_hift(tiny_config, tiny_state)
    mel = torch.randn(1, 80, 10, generator=torch.Generator().manual_seed(0))
    first = model.inference(mel, generator=torch.Generator().manual_seed(7))
    again = model.inference(mel, generator=torch.Generator().manual_seed(7))
    other = model.inference(mel, generator=torch.Generator().manual_seed(8))
    assert torch.equal(first.wav, again.wav) and torch.equal(first.source, again.source)
    assert not torch.equal(first.wav, other.wav)
    assert first.wav.shape == (1, 4800) and first.f0.shape == (1, 10)
    assert float(first.wav.abs().max()) <= tiny_config.audio_limit


def test_fold_weight_norm_keeps_output_bitwise(
    tiny_config: HiFTConfig, tiny_state: dict[str, torch.Tensor]
) -> None:
    unfolded = build_hift(tiny_config, tiny_state, fold=False)
    folded = build_hift(tiny_config, tiny_state)
    assert fold_weight_norm(HiFTGenerator(tiny_config)) == WEIGHT_NORMED_CONVS
    assert not any("parametrizations" in k for k in folded.state_dict())
    mel = torch.randn(1, 80, 6, generator=torch.Generator().manual_seed(1))
    noise = draw_source_noise(1, 9, 6 * 480, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        assert torch.equal(unfolded(mel, noise.normal), folded(mel, noise.normal))


def test_frame_rate_source_equals_upstream_audio_rate_order(
    tiny_config: HiFTConfig, tiny_state: dict[str, torch.Tensor]
) -> None:
    source = build_hift(tiny_config, tiny_state).m_source
    gen = torch.Generator().manual_seed(5)
    f0 = torch.rand(2, 40, generator=gen) * 400  # voiced and unvoiced frames, batch of 2
    f0[:, 5:9] = 0.0
    noise = draw_source_noise(2, 9, 40 * 480, generator=gen)
    frame, uv = source.sine_waves(f0, noise.normal)
    audio, audio_uv = sine_waves_audio_rate(source, f0, noise)
    assert torch.equal(uv, audio_uv)
    assert torch.equal(frame, audio)  # the random initial phase provably has no effect


def test_conv_istft_matches_torch_istft_on_random_spectra() -> None:
    gen = torch.Generator().manual_seed(9)
    real = torch.randn(2, 9, 301, generator=gen) * 10
    imag = torch.randn(2, 9, 301, generator=gen) * 10
    ours = ConvISTFT(16, 4)(real, imag)
    upstream = torch_istft(real, imag, 16, 4)
    assert ours.shape == upstream.shape == (2, 1200)
    assert float((ours - upstream).abs().max()) < 1e-5 * float(upstream.abs().max())


def test_conv_istft_inverts_the_source_stft() -> None:
    signal = torch.randn(1, 4800, generator=torch.Generator().manual_seed(2))
    spec = SourceSTFT(16, 4)(signal)
    rebuilt = ConvISTFT(16, 4)(spec[:, :9], spec[:, 9:])
    assert float((rebuilt - signal).abs().max()) < 1e-5


def test_config_from_model_yaml_equals_reference_full(
    ref: ReferenceSet, published_yaml: Path
) -> None:
    from_yaml = HiFTConfig.from_model_yaml(load_plain_yaml(published_yaml))
    assert from_yaml == hift_config_from_reference(ref.config, "full")


def test_config_missing_key_names_it(published_yaml: Path) -> None:
    text = published_yaml.read_text()
    assert text.count("    lrelu_slope: 0.1\n") == 1
    published_yaml.write_text(text.replace("    lrelu_slope: 0.1\n", ""))
    with pytest.raises(ModelLoadError, match="lrelu_slope"):
        HiFTConfig.from_model_yaml(load_plain_yaml(published_yaml))


def test_sinegen1_rate_is_refused(ref: ReferenceSet) -> None:
    config = json.loads(json.dumps(ref.config))
    config["common"]["hift_fixed"]["sampling_rate"] = 22050
    with pytest.raises(ModelLoadError, match="22050"):
        hift_config_from_reference(config, "tiny")


def test_other_tiny_configuration_builds_on_meta_and_runs(ref: ReferenceSet) -> None:
    config = json.loads(json.dumps(ref.config))
    config["tiny"]["hift"] = {"base_channels": 24, "f0_predictor_cond_channels": 8}
    config["common"]["hift_fixed"]["upsample_rates"] = [4, 5, 3]
    config["common"]["hift_fixed"]["upsample_kernel_sizes"] = [8, 11, 7]
    hift_config = hift_config_from_reference(config, "tiny")
    assert hift_config.samples_per_frame == 240
    with torch.device("meta"):
        state = HiFTGenerator(hift_config).state_dict()
    real = {k: torch.randn(v.shape, generator=torch.Generator().manual_seed(0)) * 0.05
            for k, v in state.items()}  # fmt: skip
    model = build_hift(hift_config, real)
    out = model.inference(torch.randn(1, 80, 7), generator=torch.Generator().manual_seed(1))
    assert out.wav.shape == (1, 7 * 240) and torch.isfinite(out.wav).all()


def test_bfloat16_convolutions_keep_a_float32_source(
    tiny_config: HiFTConfig, tiny_state: dict[str, torch.Tensor]
) -> None:
    model = build_hift(tiny_config, tiny_state, dtype=torch.bfloat16)
    assert model.conv_pre.weight.dtype == torch.bfloat16
    assert model.m_source.l_linear.weight.dtype == torch.float32
    assert model.f0_predictor.classifier.weight.dtype == torch.float32
    assert model.istft.bases.dtype == torch.float32
    out = model.inference(torch.randn(1, 80, 5), generator=torch.Generator().manual_seed(0))
    assert out.wav.dtype == torch.float32 and torch.isfinite(out.wav).all()


def test_bench_function_runs_on_a_small_configuration(tiny_config: HiFTConfig) -> None:
    result = bench_hift(tiny_config, frames=4, runs=1, threads=1)
    assert result.frames == 4 and len(result.runs_s) == 1 and result.first_s > 0


def test_normalize_keys_strips_every_generator_substring() -> None:
    state = {"generator.conv_pre.generator.weight_g": torch.zeros(1)}
    assert list(normalize_hift_keys(state)) == ["conv_pre.parametrizations.weight.original0"]
