"""Hyperparameters of the HiFT vocoder (HiFTGenerator + ConvRNNF0Predictor), read from files.

Every size comes from the model directory's upstream-format `cosyvoice2.yaml`; nothing here is a
model size. Upstream picks its sine generator by sample rate: 22050 Hz selects the older
audio-rate `SineGen` (CosyVoice 1), every other rate `SineGen2`, which is what we build.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import prod
from typing import Any

from shared.errors import ModelLoadError

SINEGEN1_SAMPLE_RATE = 22050  # upstream uses the audio-rate SineGen only at this rate


@dataclass(frozen=True)
class HiFTConfig:
    """Every size and constant of the vocoder; `base_channels` halves at each upsampling stage."""

    in_channels: int
    base_channels: int
    nb_harmonics: int
    sampling_rate: int
    nsf_alpha: float
    nsf_sigma: float
    nsf_voiced_threshold: float
    upsample_rates: tuple[int, ...]
    upsample_kernel_sizes: tuple[int, ...]
    istft_n_fft: int
    istft_hop: int
    resblock_kernel_sizes: tuple[int, ...]
    resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    source_resblock_kernel_sizes: tuple[int, ...]
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...]
    lrelu_slope: float
    audio_limit: float
    f0_in_channels: int
    f0_cond_channels: int
    f0_num_class: int = 1

    def __post_init__(self) -> None:
        stages = len(self.upsample_rates)
        if len(self.upsample_kernel_sizes) != stages:
            raise ModelLoadError("hift: upsample_rates and upsample_kernel_sizes differ in length")
        if len(self.source_resblock_kernel_sizes) != stages:
            raise ModelLoadError("hift: need one source_resblock_kernel_size per upsample stage")
        if len(self.resblock_kernel_sizes) != len(self.resblock_dilation_sizes):
            raise ModelLoadError("hift: resblock kernel and dilation lists differ in length")
        if self.base_channels % (2**stages):
            raise ModelLoadError(f"hift: base_channels must be divisible by 2**{stages}")
        if self.sampling_rate == SINEGEN1_SAMPLE_RATE:
            raise ModelLoadError(
                "hift: sampling_rate 22050 selects upstream's audio-rate SineGen (CosyVoice 1), "
                "which cosyq does not implement; CosyVoice 2 uses 24000"
            )
        if self.f0_num_class != 1:
            raise ModelLoadError("hift: f0_predictor num_class must be 1 (one f0 per frame)")

    @property
    def samples_per_frame(self) -> int:
        """Audio samples per mel frame: prod(upsample_rates) * hop  # 8*5*3*4 = 480."""
        return prod(self.upsample_rates) * self.istft_hop

    @property
    def n_bins(self) -> int:
        """One-sided STFT bins of the source/output spectrum: n_fft // 2 + 1  # 9."""
        return self.istft_n_fft // 2 + 1

    @classmethod
    def from_model_yaml(cls, doc: Mapping[str, Any]) -> HiFTConfig:
        """From the plain-data dict `load_plain_yaml()` returns for `cosyvoice2.yaml`."""
        try:
            hift = doc["hift"]
            predictor = hift["f0_predictor"]
            return hift_config_from_fields(
                hift,
                base_channels=hift["base_channels"],
                f0_cond_channels=predictor["cond_channels"],
                f0_in_channels=predictor["in_channels"],
                f0_num_class=predictor.get("num_class", 1),
            )
        except (KeyError, TypeError) as e:
            raise ModelLoadError(f"cosyvoice2.yaml: hift key missing: {e}") from e


def hift_config_from_fields(
    src: Mapping[str, Any],
    *,
    base_channels: int,
    f0_in_channels: int,
    f0_cond_channels: int,
    f0_num_class: int = 1,
) -> HiFTConfig:
    """A `HiFTConfig` from upstream's `HiFTGenerator` keyword names plus the per-size values.

    `src` holds the generator's keywords (`in_channels`, `upsample_rates`, `istft_params`, ...);
    the keyword arguments carry what lies outside that section (the f0 predictor's sizes). A
    missing field raises `KeyError`; the caller names the section it read.
    """
    return HiFTConfig(
        in_channels=int(src["in_channels"]),
        base_channels=int(base_channels),
        nb_harmonics=int(src["nb_harmonics"]),
        sampling_rate=int(src["sampling_rate"]),
        nsf_alpha=float(src["nsf_alpha"]),
        nsf_sigma=float(src["nsf_sigma"]),
        nsf_voiced_threshold=float(src["nsf_voiced_threshold"]),
        upsample_rates=tuple(int(v) for v in src["upsample_rates"]),
        upsample_kernel_sizes=tuple(int(v) for v in src["upsample_kernel_sizes"]),
        istft_n_fft=int(src["istft_params"]["n_fft"]),
        istft_hop=int(src["istft_params"]["hop_len"]),
        resblock_kernel_sizes=tuple(int(v) for v in src["resblock_kernel_sizes"]),
        resblock_dilation_sizes=_nested(src["resblock_dilation_sizes"]),
        source_resblock_kernel_sizes=tuple(int(v) for v in src["source_resblock_kernel_sizes"]),
        source_resblock_dilation_sizes=_nested(src["source_resblock_dilation_sizes"]),
        lrelu_slope=float(src["lrelu_slope"]),
        audio_limit=float(src["audio_limit"]),
        f0_in_channels=int(f0_in_channels),
        f0_cond_channels=int(f0_cond_channels),
        f0_num_class=int(f0_num_class),
    )


def _nested(rows: Any) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(int(v) for v in row) for row in rows)
