"""Hyperparameters of CosyVoice 3's causal HiFT: CosyVoice 2's `HiFTConfig` plus the look-aheads.

The generator keywords are the same as CosyVoice 2's (read by `hift_config_from_fields`);
`conv_pre_look_right` is new in the yaml. The F0 predictor's look-ahead (3 frames: its first
conv has kernel 4, all right context) is hard-coded upstream and a default here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.errors import ModelLoadError
from workers.model.hift.config import HiFTConfig, hift_config_from_fields

# Upstream's SineGen2 (causal) draws its uniform noise buffer for 300 s at 24 kHz.
SOURCE_BUFFER_SECONDS = 300


@dataclass(frozen=True)
class CausalHiFTConfig:
    """The generator's sizes (`base`) and the causal look-aheads, in mel frames."""

    base: HiFTConfig
    conv_pre_look_right: int = 4
    f0_look_right: int = 3

    def __post_init__(self) -> None:
        if self.conv_pre_look_right < 0 or self.f0_look_right < 0:
            raise ModelLoadError("causal hift: look-aheads must not be negative")

    @property
    def lookahead_frames(self) -> int:
        """Mel frames a non-final call keeps as context only: F0 + conv_pre + 1 dropped  # 8."""
        return self.f0_look_right + self.conv_pre_look_right + 1

    @property
    def buffer_samples(self) -> int:
        """Length of upstream's fixed source buffer: 300 s of audio  # 7 200 000."""
        return SOURCE_BUFFER_SECONDS * self.base.sampling_rate

    @classmethod
    def from_fields(
        cls,
        src: Mapping[str, Any],
        *,
        base_channels: int,
        f0_in_channels: int,
        f0_cond_channels: int,
        f0_num_class: int = 1,
    ) -> CausalHiFTConfig:
        """From upstream's `CausalHiFTGenerator` keywords (KeyError when one is missing)."""
        base = hift_config_from_fields(
            src,
            base_channels=base_channels,
            f0_in_channels=f0_in_channels,
            f0_cond_channels=f0_cond_channels,
            f0_num_class=f0_num_class,
        )
        return cls(base=base, conv_pre_look_right=int(src.get("conv_pre_look_right", 4)))

    @classmethod
    def from_model_yaml(cls, doc: Mapping[str, Any]) -> CausalHiFTConfig:
        """From the plain-data dict `load_plain_yaml()` returns for `cosyvoice3.yaml`."""
        try:
            hift = doc["hift"]
            predictor = hift["f0_predictor"]
            return cls.from_fields(
                hift,
                base_channels=hift["base_channels"],
                f0_in_channels=predictor["in_channels"],
                f0_cond_channels=predictor["cond_channels"],
                f0_num_class=predictor.get("num_class", 1),
            )
        except (KeyError, TypeError) as e:
            raise ModelLoadError(f"cosyvoice3.yaml: hift key missing: {e}") from e
