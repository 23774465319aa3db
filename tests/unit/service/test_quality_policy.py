"""The verdict and the action on suspect audio follow the settings and the request."""

from __future__ import annotations

import time

import numpy as np
import pytest

from shared.errors import QualityError
from shared.jobs import RequestLimits, validate_request
from shared.results import QualityReport
from shared.settings import load_settings
from workers.engine.api import PieceSpan, SynthesisInput, SynthesisOutput, VoicePrompt
from workers.service.quality import (
    QualityPolicy,
    checked_output,
    judge,
    process_audio,
    retry_seed,
)

RATE = 24000
PROMPT = VoicePrompt(
    speech_tokens=np.zeros(2, np.int32),
    mel=np.zeros((4, 80), np.float32),
    embedding=np.zeros(192, np.float32),
    transcript="",
)
REQUEST = SynthesisInput(text="a long text", prompt=PROMPT, seed=7)


def output(
    seconds: float, *, text_tokens: int = 10, stop: str = "stop_token", seed: int | None = 7
) -> SynthesisOutput:
    """A tone of `seconds` for a text of `text_tokens` (expected 0.3 s per token)."""
    t = np.arange(round(seconds * RATE)) / RATE
    samples = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    piece = PieceSpan("a long text", 0, samples.size, int(seconds * 25), stop, 0.0)
    return SynthesisOutput(
        samples=samples,
        sample_rate=RATE,
        stage_seconds={"llm": 1.0, "flow": 0.5},
        pieces=[piece],
        text_tokens=text_tokens,
        seed=seed,
    )


def test_audio_of_the_expected_length_is_ok() -> None:
    judged = judge(output(3.0), QualityPolicy())
    assert judged.verdict == "ok" and judged.reasons == ()
    assert judged.expected_s == pytest.approx(3.0)


def test_a_too_short_waveform_for_a_long_text_is_suspect() -> None:
    judged = judge(output(1.0, text_tokens=40), QualityPolicy())  # 12 s expected
    assert judged.verdict == "suspect"
    assert judged.reasons[0].startswith("too_short: 0.08x the expected length, min 0.35")


def test_a_runaway_and_a_too_long_result_are_suspect() -> None:
    reasons = judge(output(9.0, stop="length_bound"), QualityPolicy()).reasons
    assert [r.split(":")[0] for r in reasons] == ["too_long", "runaway"]


def test_thresholds_come_from_settings() -> None:
    audio = output(3.0)
    audio.samples[RATE : 3 * RATE - RATE // 2] = 0.0  # 1.5 s of silence inside
    settings = load_settings(env_file=None)
    assert judge(audio, QualityPolicy.from_settings(settings)).verdict == "ok"
    strict = load_settings(env_file=None, quality_max_silence_s=1.0)
    reasons = judge(audio, QualityPolicy.from_settings(strict)).reasons
    assert reasons == ("long_silence: 1.50 s, max 1 s",)
    short = judge(output(0.5, text_tokens=2), QualityPolicy())  # 0.6 s expected: not judged
    assert short.verdict == "ok"


def test_retry_keeps_the_first_ok_attempt_and_records_every_seed() -> None:
    seeds: list[int | None] = []

    def again(data: SynthesisInput) -> SynthesisOutput:
        seeds.append(data.seed)
        return output(3.0, seed=data.seed)

    kept, report = checked_output(
        output(9.0, stop="length_bound"),
        REQUEST,
        QualityPolicy(retries=2),
        on_suspect="retry",
        resynthesize=again,
        deadline=None,
    )
    assert seeds == [retry_seed(7, 1)] and seeds[0] != 7
    assert report.verdict == "ok" and report.action == "retried" and report.retries == 1
    assert [(a.seed, a.verdict) for a in report.attempts] == [(7, "suspect"), (seeds[0], "ok")]
    assert kept.seed == seeds[0]
    assert kept.stage_seconds == {"llm": 2.0, "flow": 1.0}  # both attempts count


def test_retry_stops_after_the_retries_and_keeps_the_best() -> None:
    calls: list[int | None] = []

    def still_bad(data: SynthesisInput) -> SynthesisOutput:
        calls.append(data.seed)
        return output(3.0, stop="length_bound", seed=data.seed)  # a runaway, of the right length

    first = output(1.0, text_tokens=40, stop="length_bound")  # too short and a runaway
    kept, report = checked_output(
        first,
        REQUEST,
        QualityPolicy(retries=2),
        on_suspect="retry",
        resynthesize=still_bad,
        deadline=None,
    )
    assert len(calls) == 2 and len(set(calls)) == 2
    assert report.verdict == "suspect" and report.action == "retried"
    assert len(report.attempts) == 3
    assert kept.seed == calls[0]  # one reason against the first's two; the earlier of a tie


def test_no_retry_that_would_not_fit_before_the_deadline() -> None:
    def never(data: SynthesisInput) -> SynthesisOutput:
        raise AssertionError("no time was left for a retry")

    _, report = checked_output(
        output(9.0, stop="length_bound"),
        REQUEST,
        QualityPolicy(retries=2),
        on_suspect="retry",
        resynthesize=never,
        deadline=time.perf_counter() + 1.0,  # the first attempt took 1.5 s of stages
    )
    assert report.action == "accepted" and len(report.attempts) == 1


def test_fail_raises_with_the_reasons_and_accept_flags() -> None:
    with pytest.raises(QualityError, match=r"suspect audio: runaway: piece 0 reached") as e:
        checked_output(
            output(3.0, stop="length_bound"),
            REQUEST,
            QualityPolicy(),
            on_suspect="fail",
            resynthesize=None,
            deadline=None,
        )
    assert e.value.reasons == ("runaway: piece 0 reached the length bound",)
    _, report = checked_output(
        output(3.0, stop="length_bound"),
        REQUEST,
        QualityPolicy(),
        on_suspect="accept",
        resynthesize=None,
        deadline=None,
    )
    assert report.verdict == "suspect" and report.action == "accepted"
    _, report = checked_output(
        output(3.0), REQUEST, QualityPolicy(), on_suspect="fail", resynthesize=None, deadline=None
    )
    assert report.verdict == "ok" and report.action == "none"


def test_trim_silence_moves_the_piece_spans_with_the_audio() -> None:
    """The result's piece timings (captions) describe the stored, trimmed audio."""
    speech = output(1.0)
    samples = np.concatenate(
        [np.zeros(RATE, np.float32), speech.samples, np.zeros(RATE, np.float32)]
    )
    untrimmed = SynthesisOutput(
        samples=samples,
        sample_rate=RATE,
        pieces=[PieceSpan("a long text", RATE, 2 * RATE, 25, "stop_token", 0.0)],
    )
    request = validate_request({"text": "a long text", "trim_silence": True}, RequestLimits())
    report = QualityReport(verdict="ok")
    trimmed, report = process_audio(untrimmed, request, load_settings(env_file=None), report)
    [piece] = trimmed.pieces
    assert np.array_equal(trimmed.samples[piece.start : piece.end], speech.samples)
    assert (piece.text, piece.stop, piece.speech_tokens) == ("a long text", "stop_token", 25)
    assert report.trimmed_s == pytest.approx(2 * (1.0 - 0.15), abs=0.03)
    assert (samples.size - trimmed.samples.size) / RATE == report.trimmed_s


def test_loudness_at_another_rate_resamples_first_and_keeps_the_spans_in_seconds() -> None:
    """Issue 45 item 9: the levels are set on the delivered rate's samples, and the spans
    (captions) move to that rate with the same times."""
    speech = output(1.0)
    samples = np.concatenate([np.zeros(RATE // 2, np.float32), speech.samples])
    made = SynthesisOutput(
        samples=samples,
        sample_rate=RATE,
        pieces=[PieceSpan("a long text", RATE // 2, RATE // 2 + RATE, 25, "stop_token", 0.0)],
    )
    asked = {"text": "a long text", "loudness_lufs": -16, "sample_rate": 8000}
    request = validate_request(asked, RequestLimits())
    report = QualityReport(verdict="ok")
    delivered, report = process_audio(made, request, load_settings(env_file=None), report)
    [piece] = delivered.pieces
    assert delivered.sample_rate == 8000 and delivered.samples.size == samples.size // 3
    assert (piece.start / 8000, piece.end / 8000) == (0.5, 1.5)
    assert report.output_lufs == pytest.approx(-16.0, abs=0.1)
