"""The quality check's settings (`COSYQ_QUALITY_*`), a block of `Settings` fields kept apart so
settings.py stays small; `Settings` inherits them and reads them like its own.

README, "Quality of every result", says why each default is what it is.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class QualitySettings(BaseModel):
    """What counts as suspect audio, what a suspect result gets, and the trim's margin."""

    quality_on_suspect: Literal["retry", "fail", "accept"] = Field(
        "accept", description="suspect audio by default: retry (new seed), fail or accept"
    )
    quality_retries: int = Field(2, ge=0, le=10, description="most re-syntheses (retry)")
    quality_min_length_ratio: float = Field(
        0.35, ge=0, description="speech s / s expected from the text under this: suspect"
    )
    quality_max_length_ratio: float = Field(
        2.2, gt=0, description="speech s / s expected from the text over this: suspect"
    )
    quality_min_expected_s: float = Field(
        1.0, ge=0, description="length checks only for texts expected to last this long"
    )
    quality_max_silence_s: float = Field(2.0, gt=0, description="longest silence inside speech")
    quality_max_edge_silence_s: float = Field(
        1.5, gt=0, description="longest leading or trailing silence"
    )
    quality_max_clipped_share: float = Field(
        0.001, ge=0, le=1, description="share of samples at the vocoder's limit (clipping)"
    )
    quality_max_tail_repeat: float = Field(
        0.9, gt=0, le=1, description="share of a piece's last 2 s of tokens in a loop (<= 1 s)"
    )
    quality_silence_dbfs: float = Field(-50.0, lt=0, description="silent 20 ms frame: RMS under")
    quality_import_at_start: bool = Field(
        True, description="import the loudness measure's scipy before ready, not in a first job"
    )
    quality_trim_margin_ms: int = Field(150, ge=0, description="silence trim_silence keeps")
