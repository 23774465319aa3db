"""The quality request fields: each bad value is refused naming the field and the rule."""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import InvalidRequestError
from shared.jobs import RequestLimits, validate_request

BAD = [
    ({"on_suspect": "ignore"}, "on_suspect: input should be 'retry', 'fail' or 'accept'"),
    ({"loudness_lufs": -80}, "loudness_lufs: -80.0 is outside -50 to -5 LUFS"),
    ({"loudness_lufs": float("nan")}, "loudness_lufs: nan is outside -50 to -5 LUFS"),
    ({"loudness_lufs": -16, "true_peak_dbtp": 1}, "true_peak_dbtp: 1.0 is outside -20 to 0 dBTP"),
    ({"true_peak_dbtp": -2}, "true_peak_dbtp: only used with loudness_lufs"),
    ({"trim_silence": "yes"}, "trim_silence: input should be a valid boolean"),
    ({"stream": True, "loudness_lufs": -16}, "loudness_lufs: not with stream"),
    ({"stream": True, "trim_silence": True}, "trim_silence: not with stream"),
    ({"stream": True, "on_suspect": "retry"}, "on_suspect: retry needs stream false"),
]


@pytest.mark.parametrize(("fields", "message"), BAD)
def test_bad_quality_fields_name_the_field_and_rule(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidRequestError) as e:
        validate_request({"text": "Hello there.", **fields}, RequestLimits())
    assert message in str(e.value)


def test_good_quality_fields() -> None:
    request = validate_request(
        {
            "text": "Hello there.",
            "on_suspect": "fail",
            "loudness_lufs": -16,
            "true_peak_dbtp": -1.5,
            "trim_silence": True,
        },
        RequestLimits(),
    )
    assert (request.on_suspect, request.loudness_lufs, request.true_peak_dbtp) == (
        "fail",
        -16,
        -1.5,
    )
    assert validate_request(
        {"text": "Hi.", "stream": True, "on_suspect": "fail"}, RequestLimits()
    ).stream
