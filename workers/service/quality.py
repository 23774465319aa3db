"""The quality check of every result: the verdict from the measures, and what a suspect
result gets (`on_suspect`): synthesized again with a new seed, failed, or stored flagged.

The thresholds are about CosyVoice 2's known failure modes, not about any one voice (README,
"Quality"): audio far shorter than its text (a dropped segment), far longer or a piece that
ran to the LLM's length bound (a sentence read twice, babble), long silences, clipping, a loop
of speech tokens. Retries run inside the job, on the engine the job already used (the batch
session's model thread on the batched path), count in the job's stage timings and start only
while one more attempt of the same length still fits in the job's timeout.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shared.audio import resample
from shared.errors import QualityError
from shared.jobs import DEFAULT_TRUE_PEAK_DBTP, SynthesisRequest
from shared.results import PieceQuality, QualityAttempt, QualityReport, Verdict
from shared.settings import Settings
from shared.text_markup import speech_seconds
from workers.engine.api import PieceSpan, SynthesisInput, SynthesisOutput
from workers.engine.loudness import normalise_loudness, trim_bounds
from workers.engine.quality import AudioMeasures, measure_audio

Resynthesize = Callable[[SynthesisInput], SynthesisOutput]
SEED_STEP = 0x9E3779B9  # a retry's seed: the attempt's own plus k golden-ratio steps (mod 2**32)
FIT_FACTOR = 1.25  # a retry starts only when 1.25x the last attempt's time is left


@dataclass(frozen=True)
class QualityPolicy:
    """Thresholds and the default action, from Settings (COSYQ_QUALITY_*)."""

    on_suspect: str = "accept"
    retries: int = 2
    min_length_ratio: float = 0.35
    max_length_ratio: float = 2.2
    min_expected_s: float = 1.0
    max_silence_s: float = 2.0
    max_edge_silence_s: float = 1.5
    max_clipped_share: float = 0.001
    max_tail_repeat: float = 0.9
    silence_dbfs: float = -50.0

    @classmethod
    def from_settings(cls, settings: Settings) -> QualityPolicy:
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{name: getattr(settings, f"quality_{name}") for name in names})


@dataclass(frozen=True)
class Judged:
    """One attempt's output, its measures and verdict."""

    output: SynthesisOutput
    measures: AudioMeasures
    expected_s: float
    reasons: tuple[str, ...]
    measure_s: float

    @property
    def verdict(self) -> Verdict:
        return "suspect" if self.reasons else "ok"

    def attempt(self) -> QualityAttempt:
        return QualityAttempt(
            seed=self.output.seed, verdict=self.verdict, reasons=list(self.reasons)
        )


def judge(output: SynthesisOutput, policy: QualityPolicy, *, speed: float = 1.0) -> Judged:
    """Measure one output and name every threshold it breaks."""
    started = time.perf_counter()
    spans = [(p.start, p.end) for p in output.pieces if p.end > p.start]
    measures = measure_audio(
        output.samples, output.sample_rate, spans, silence_dbfs=policy.silence_dbfs
    )
    expected = speech_seconds(output.text_tokens) / speed
    reasons = suspect_reasons(output, measures, expected, policy)
    return Judged(output, measures, expected, reasons, time.perf_counter() - started)


def suspect_reasons(
    output: SynthesisOutput, m: AudioMeasures, expected_s: float, policy: QualityPolicy
) -> tuple[str, ...]:
    """Each broken threshold as "measure: value, limit" (the order of the README's table)."""
    reasons: list[str] = []
    if expected_s >= policy.min_expected_s:
        ratio = m.speech_s / expected_s
        if ratio < policy.min_length_ratio:
            reasons.append(
                f"too_short: {ratio:.2f}x the expected length, min {policy.min_length_ratio:g}"
            )
        if ratio > policy.max_length_ratio:
            reasons.append(
                f"too_long: {ratio:.2f}x the expected length, max {policy.max_length_ratio:g}"
            )
    runaways = [i for i, p in enumerate(output.pieces) if p.stop == "length_bound"]
    if runaways:
        reasons.append(f"runaway: piece {', '.join(map(str, runaways))} reached the length bound")
    loops = [i for i, p in enumerate(output.pieces) if p.tail_repeat > policy.max_tail_repeat]
    if loops:
        reasons.append(f"token_loop: piece {', '.join(map(str, loops))} ends in a repeating loop")
    if m.longest_silence_s > policy.max_silence_s:
        reasons.append(f"long_silence: {m.longest_silence_s:.2f} s, max {policy.max_silence_s:g} s")
    edge = max(m.leading_silence_s, m.trailing_silence_s)
    if edge > policy.max_edge_silence_s:
        reasons.append(f"edge_silence: {edge:.2f} s, max {policy.max_edge_silence_s:g} s")
    if m.clipped_share > policy.max_clipped_share:
        reasons.append(
            f"clipping: {m.clipped_share:.2%} of samples, max {policy.max_clipped_share:.2%}"
        )
    return tuple(reasons)


def checked_output(
    first: SynthesisOutput,
    request: SynthesisInput,
    policy: QualityPolicy,
    *,
    on_suspect: str,
    resynthesize: Resynthesize | None,
    deadline: float | None,
) -> tuple[SynthesisOutput, QualityReport]:
    """The output to store and its report; raises QualityError when `on_suspect` is fail.

    retry: new seeds until one attempt is ok, `policy.retries` are spent or the next attempt
    would not fit before `deadline` (perf_counter seconds); the best attempt is kept (ok before
    suspect, then fewer reasons, then the earlier). No `resynthesize` (a streamed job, whose
    chunks are out): no retry, the result is stored flagged."""
    attempts = [judge(first, policy, speed=request.speed)]
    last_s = sum(first.stage_seconds.values())
    while (
        on_suspect == "retry"
        and resynthesize is not None
        and attempts[-1].reasons
        and len(attempts) <= policy.retries
        and _fits(last_s, deadline)
    ):
        started = time.perf_counter()
        seed = retry_seed(first.seed if first.seed is not None else request.seed, len(attempts))
        output = resynthesize(dataclasses.replace(request, seed=seed))
        attempts.append(judge(output, policy, speed=request.speed))
        last_s = time.perf_counter() - started
    best = min(attempts, key=lambda a: (bool(a.reasons), len(a.reasons)))
    action = _action(best, on_suspect, len(attempts))
    report = _report(best, attempts, action)
    if action == "failed":
        message = "suspect audio: " + "; ".join(best.reasons)
        raise QualityError(message, reasons=best.reasons)
    return _with_all_stages(best.output, attempts), report


def retry_seed(seed: int | None, attempt: int) -> int | None:
    """Attempt k's seed, derived from the first one's (the same request and seed retry alike)."""
    return None if seed is None else (seed + attempt * SEED_STEP) % 2**32


def _fits(last_s: float, deadline: float | None) -> bool:
    return deadline is None or time.perf_counter() + FIT_FACTOR * last_s < deadline


def _action(best: Judged, on_suspect: str, attempts: int) -> str:
    if not best.reasons:
        return "retried" if attempts > 1 else "none"
    if on_suspect == "fail":
        return "failed"
    return "retried" if attempts > 1 else "accepted"


def _with_all_stages(output: SynthesisOutput, attempts: list[Judged]) -> SynthesisOutput:
    """The kept output with every attempt's stage seconds: retries count in the timings."""
    if len(attempts) == 1:
        return output
    stages: dict[str, float] = {}
    for attempt in attempts:
        for stage, seconds in attempt.output.stage_seconds.items():
            stages[stage] = stages.get(stage, 0.0) + seconds
    return dataclasses.replace(output, stage_seconds=stages)


def _report(best: Judged, attempts: list[Judged], action: str) -> QualityReport:
    m = best.measures
    return QualityReport(
        verdict=best.verdict,
        reasons=list(best.reasons),
        speech_s=m.speech_s,
        expected_s=best.expected_s,
        length_ratio=m.speech_s / best.expected_s if best.expected_s > 0 else None,
        longest_silence_s=m.longest_silence_s,
        leading_silence_s=m.leading_silence_s,
        trailing_silence_s=m.trailing_silence_s,
        clipped_share=m.clipped_share,
        peak_dbfs=m.peak_dbfs,
        loudness_lufs=m.loudness_lufs,
        true_peak_dbtp=m.true_peak_dbtp,
        pieces=[
            PieceQuality(stop=p.stop, speech_tokens=p.speech_tokens, tail_repeat=p.tail_repeat)
            for p in best.output.pieces
        ],
        attempts=[a.attempt() for a in attempts],
        action=action,
        trimmed_s=0.0,
        measure_s=sum(a.measure_s for a in attempts),
    )


def process_audio(
    output: SynthesisOutput,
    request: SynthesisRequest,
    settings: Settings,
    report: QualityReport,
) -> tuple[SynthesisOutput, QualityReport]:
    """trim_silence, then loudness_lufs under true_peak_dbtp, as the request asks; the report
    gains what was done, and the pieces' spans move with a trimmed start.

    Loudness is set at the request's sample rate (the output is resampled to it first, its
    spans with it): what is delivered is what meets the target (levels.py then measures the
    encoded file itself)."""
    update: dict[str, object] = {}
    samples, rate = output.samples, output.sample_rate
    if request.trim_silence:
        start, end = trim_bounds(
            samples,
            rate,
            silence_dbfs=settings.quality_silence_dbfs,
            margin_s=settings.quality_trim_margin_ms / 1000,
        )
        samples = samples[start:end]
        update["trimmed_s"] = (output.samples.size - samples.size) / rate
        output = dataclasses.replace(output, pieces=shifted(output.pieces, start, samples.size))
    if request.loudness_lufs is not None:
        output, samples = at_rate(output, samples, request.sample_rate)
        rate = output.sample_rate
        ceiling = request.true_peak_dbtp
        ceiling = DEFAULT_TRUE_PEAK_DBTP if ceiling is None else ceiling
        done = normalise_loudness(samples, rate, request.loudness_lufs, ceiling)
        samples = done.samples
        update |= {
            "gain_db": done.gain_db,
            "output_lufs": done.lufs,
            "output_true_peak_dbtp": done.true_peak_dbtp,
        }
    if not update:
        return output, report
    return dataclasses.replace(output, samples=samples), report.model_copy(update=update)


def shifted(pieces: list[PieceSpan], cut: int, size: int) -> list[PieceSpan]:
    """Spans in audio whose first `cut` samples were removed and that is now `size` long."""
    return [
        dataclasses.replace(
            p, start=min(size, max(0, p.start - cut)), end=min(size, max(0, p.end - cut))
        )
        for p in pieces
    ]


def at_rate(
    output: SynthesisOutput, samples: np.ndarray, rate: int
) -> tuple[SynthesisOutput, np.ndarray]:
    """`samples` (at output.sample_rate) resampled to `rate`, and the output's spans with them."""
    if rate == output.sample_rate:
        return output, samples
    resampled = resample(samples, output.sample_rate, rate)
    pieces = rescaled(output.pieces, rate / output.sample_rate, resampled.size)
    return dataclasses.replace(output, sample_rate=rate, pieces=pieces), resampled


def rescaled(pieces: list[PieceSpan], factor: float, size: int) -> list[PieceSpan]:
    """Spans in audio resampled by `factor` (new rate / old rate) that is now `size` long."""
    return [
        dataclasses.replace(
            p, start=min(size, round(p.start * factor)), end=min(size, round(p.end * factor))
        )
        for p in pieces
    ]


def quality_log_fields(report: QualityReport) -> dict[str, object]:
    """The quality block's headline in the synthesis_finished line."""
    return {
        "quality_verdict": report.verdict,
        "quality_reasons": report.reasons,
        "quality_action": report.action,
        "quality_attempts": len(report.attempts),
        "quality_measure_s": round(report.measure_s, 4),
    }
