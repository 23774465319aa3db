"""HiFT parity with the official implementation (`hift_reference.npz`, keys-hift*.txt).

Checks, all on the reference tiny checkpoint loaded strictly:
- f0 (compared relative to the largest |f0|: README's rtol 1e-5 on values up to ~206 Hz);
- the waveform from the stored fixed excitation, through our `ConvISTFT` (the default path)
  and through upstream's `torch.istft`;
- the sine source rebuilt from the stored random draws, by our frame-rate path (the default)
  and by upstream's audio-rate order with the initial phase; uv and upsampled f0;
- full inference from the rebuilt source, and end to end from a generator seeded like upstream;
- FULL-size key lists in both weight-norm styles (and with a `generator.` prefix) via
  the loader's renaming, built on the meta device.
"""

from __future__ import annotations

import torch

from workers.model.checkpoint import read_state_dict
from workers.model.hift.istft import torch_istft
from workers.model.hift.model import HiFTGenerator, build_hift, normalize_hift_key
from workers.model.hift.source import SourceNoise, draw_source_noise, sine_waves_audio_rate
from workers.tools.reference.configs import hift_config_from_reference
from workers.tools.reference.parity import (
    ArrayCheck,
    ReferenceSet,
    compare,
    describe_state,
    key_list_differences,
    read_key_list,
)

FILE = "hift_reference.npz"
F0_RTOL = 1e-5
WAV_ATOL = 1e-4
SOURCE_ATOL = 1e-4
NOISE_ATOL = 1e-6  # stored noise = amp · N(0,1); ours from the same seed (CPU generator)
ISTFT_AGREEMENT_ATOL = 1e-5  # ConvISTFT vs torch.istft on the same spectrum
KEY_FILES = ("keys-hift.txt", "keys-hift-legacy-weightnorm.txt")


def load_reference_hift(ref: ReferenceSet, device: torch.device) -> HiFTGenerator:
    """The reference set's tiny HiFT, loaded strictly through the production path."""
    config = hift_config_from_reference(ref.config, "tiny")
    path = ref.checkpoint("hift")
    return build_hift(config, read_state_dict(path), device=device, source=path)


@torch.inference_mode()
def check_hift(ref: ReferenceSet, device: torch.device | None = None) -> list[ArrayCheck]:
    """One ArrayCheck per reference array (some arrays checked by two paths)."""
    device = device or torch.device("cpu")
    model = load_reference_hift(ref, device)
    arrays = {k: torch.from_numpy(v) for k, v in ref.arrays(FILE).items() if v.ndim > 0}
    seed = int(ref.arrays(FILE)["infer_seed"])
    mel = arrays["mel"].to(device)
    f0 = model.f0_predictor(mel)
    checks = [_check_f0(f0, arrays["f0"])]
    checks += _check_fixed_source(model, mel, arrays["s_fixed"].to(device), arrays["wav_fixed"])
    checks += _check_source(model, f0, arrays, seed)
    checks += _check_inference(model, mel, arrays, seed)
    return checks


def _check_f0(f0: torch.Tensor, reference: torch.Tensor) -> ArrayCheck:
    scale = float(reference.abs().max())
    return compare(
        f"{FILE}:f0",
        f0.cpu() / scale,
        reference / scale,
        F0_RTOL,
        detail=f"error relative to max |f0| = {scale:.1f} Hz",
    )


def _check_fixed_source(
    model: HiFTGenerator, mel: torch.Tensor, source: torch.Tensor, reference: torch.Tensor
) -> list[ArrayCheck]:
    real, imag = model.spectrum(mel, source)
    limit = model.config.audio_limit
    ours = model.istft(real, imag).clamp(-limit, limit).cpu()
    n_fft, hop = model.config.istft_n_fft, model.config.istft_hop
    upstream = torch_istft(real.cpu(), imag.cpu(), n_fft, hop).clamp(-limit, limit)
    return [
        compare(f"{FILE}:wav_fixed", ours, reference, WAV_ATOL, detail="ConvISTFT (default)"),
        compare(f"{FILE}:wav_fixed[torch.istft]", upstream, reference, WAV_ATOL),
        compare(
            f"{FILE}:wav_fixed[ConvISTFT vs torch.istft]",
            ours,
            upstream,
            ISTFT_AGREEMENT_ATOL,
            detail="same spectrum, both inverses",
        ),
    ]


def _stored_noise(
    model: HiFTGenerator, arrays: dict[str, torch.Tensor], device: torch.device
) -> SourceNoise:
    """The stored draws as our inputs: the stored noise is amp·N(0,1), so divide amp back out."""
    amp = model.m_source.noise_amplitude(arrays["infer_uv"].transpose(1, 2))  # (B, 1, L)
    normal = arrays["infer_sinegen_noise"].transpose(1, 2) / amp  # (B, H, L)
    return SourceNoise(arrays["infer_rand_ini"].to(device), normal.to(device))


def _check_source(
    model: HiFTGenerator, f0: torch.Tensor, arrays: dict[str, torch.Tensor], seed: int
) -> list[ArrayCheck]:
    source, name = model.m_source, FILE
    stored = _stored_noise(model, arrays, f0.device)
    frame_waves, uv = source.sine_waves(f0, stored.normal)
    audio_waves, audio_uv = sine_waves_audio_rate(source, f0, stored)
    f0_up = torch.repeat_interleave(f0, source.upsample, dim=1)[:, :, None]
    scale = float(arrays["infer_f0_upsampled"].abs().max())
    batch, harmonics, samples = stored.normal.shape
    generator = torch.Generator().manual_seed(seed)
    drawn = draw_source_noise(batch, harmonics, samples, generator=generator, device=f0.device)
    drawn_noise = (drawn.normal * source.noise_amplitude(uv)).transpose(1, 2)
    return [
        compare(f"{name}:infer_uv", uv.transpose(1, 2).cpu(), arrays["infer_uv"], 0.0),
        compare(f"{name}:infer_uv[audio rate]", audio_uv.transpose(1, 2), arrays["infer_uv"], 0.0),
        compare(
            f"{name}:infer_f0_upsampled",
            f0_up.cpu() / scale,
            arrays["infer_f0_upsampled"] / scale,
            F0_RTOL,
            detail="relative to max |f0|",
        ),
        compare(
            f"{name}:infer_source",
            source.merge(frame_waves),
            arrays["infer_source"],
            SOURCE_ATOL,
            detail="frame-rate SineGen2 (default path) from the stored draws",
        ),
        compare(
            f"{name}:infer_source[audio rate]",
            source.merge(audio_waves),
            arrays["infer_source"],
            SOURCE_ATOL,
            detail="upstream's audio-rate order, stored initial phase added",
        ),
        compare(
            f"{name}:infer_rand_ini",
            drawn.rand_ini,
            arrays["infer_rand_ini"],
            0.0,
            detail=f"drawn from torch.Generator seeded {seed}",
        ),
        compare(
            f"{name}:infer_sinegen_noise",
            drawn_noise,
            arrays["infer_sinegen_noise"],
            NOISE_ATOL,
            detail=f"drawn from torch.Generator seeded {seed}",
        ),
    ]


def _check_inference(
    model: HiFTGenerator, mel: torch.Tensor, arrays: dict[str, torch.Tensor], seed: int
) -> list[ArrayCheck]:
    stored = _stored_noise(model, arrays, mel.device)
    rebuilt = model.inference(mel, noise=stored)
    seeded = model.inference(mel, generator=torch.Generator().manual_seed(seed))
    return [
        compare(f"{FILE}:infer_wav", rebuilt.wav.cpu(), arrays["infer_wav"], WAV_ATOL,
                detail="from the stored random draws"),
        compare(f"{FILE}:infer_wav[seeded]", seeded.wav.cpu(), arrays["infer_wav"], WAV_ATOL,
                detail=f"end to end, torch.Generator seeded {seed}"),
    ]  # fmt: skip


def check_hift_full_keys(ref: ReferenceSet) -> list[str]:
    """Differences between our FULL state dict and each present key file ([] = equal).

    The legacy listing is renamed by the loader's own `normalize_hift_key`; each listing is
    also checked with a `generator.` prefix on every key, as a training checkpoint has.
    """
    config = hift_config_from_reference(ref.config, "full")
    with torch.device("meta"):
        state = HiFTGenerator(config).state_dict()
    ours = describe_state(state)
    problems: list[str] = []
    for name in KEY_FILES:
        if not ref.has(name):
            continue
        listing = read_key_list(ref.root / name)
        for prefix in ("", "generator."):
            renamed = [(normalize_hift_key(prefix + k), s, d) for k, s, d in listing]
            label = f"{name} ({prefix or 'as stored'})"
            problems += key_list_differences(ours, renamed, label)
    return problems
