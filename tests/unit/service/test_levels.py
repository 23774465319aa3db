"""The delivered file's levels (workers/service/levels.py): the correction a reading asks for,
and a PCM16 file encoded at a rate other than the model's metered as a meter reads it."""

from __future__ import annotations

import numpy as np
import pytest

from shared.audio import decode_audio
from shared.jobs import SynthesisRequest
from shared.results import QualityReport
from workers.service.levels import PEAK_MARGIN_DB, Levels, correction_db, encode_delivered


def test_the_ceiling_comes_first_then_the_loudness_never_past_it() -> None:
    assert correction_db(Levels(-16.0, -0.8), -16.0, -1.0) == pytest.approx(-0.2 - PEAK_MARGIN_DB)
    assert correction_db(Levels(-17.0, -6.0), -16.0, -1.0) == pytest.approx(1.0)
    assert correction_db(Levels(-17.0, -1.5), -16.0, -1.0) == pytest.approx(0.5 - PEAK_MARGIN_DB)
    assert correction_db(Levels(-17.0, -1.0 - PEAK_MARGIN_DB), -16.0, -1.0) == 0.0
    assert correction_db(Levels(-15.0, -6.0), -16.0, -1.0) == pytest.approx(-1.0)
    assert correction_db(Levels(-16.05, -6.0), -16.0, -1.0) == 0.0  # within 0.1 LU
    assert correction_db(Levels(None, None), -16.0, -1.0) == 0.0  # silence: nothing to do


def test_a_file_off_target_is_corrected_and_its_own_levels_reported() -> None:
    import pyloudnorm  # noqa: PLC0415 (with scipy.signal ~1.1 CPU s of every test process's collection)

    rate = 8000
    t = np.arange(2 * rate) / rate
    tone = (0.05 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    before = pyloudnorm.Meter(rate).integrated_loudness(tone.astype(np.float64))  # about -30
    request = SynthesisRequest(text="x", sample_rate=rate, loudness_lufs=-20)
    encoded, report = encode_delivered(
        tone, rate, request, QualityReport(verdict="ok", gain_db=0.0)
    )
    samples, read_rate = decode_audio(encoded.data)
    measured = pyloudnorm.Meter(read_rate).integrated_loudness(samples.astype(np.float64))
    assert read_rate == rate and measured == pytest.approx(-20.0, abs=0.1)
    assert report.output_lufs == pytest.approx(measured, abs=1e-6)
    assert report.gain_db == pytest.approx(measured - before, abs=0.01)
    assert report.output_true_peak_dbtp is not None and report.output_true_peak_dbtp < -1.0
