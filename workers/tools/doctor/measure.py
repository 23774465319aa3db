"""Measure one engine against the torch-cpu fp32 reference on identical inputs, per stage.

Why identical inputs: sampling makes whole utterances incomparable (one different token changes
everything after it), so each stage gets the reference's inputs: the LLM's first step on the
same prefix, the flow on the same speech tokens and prompt, HiFT on the reference's mel with the
same source noise. Reported per stage: best time of a few calls, max abs error and SNR against
the reference; and the seed guide's table: model load, first inference, mean inference, peak
memory (RSS sampled while this backend loads and runs).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import psutil
import soundfile
import torch

from workers.engine.api import SynthesisInput, VoicePrompt
from workers.engine.pipeline import SynthesisPipeline
from workers.model.directory import PROMPT_AUDIO, PROMPT_TEXT
from workers.tools.bench.precision import first_step_logp, snr_db

STAGES = ("LLM step", "flow", "HiFT")
RSS_SAMPLE_S = 0.02
SYNTHETIC_PROMPT_S = 3.0  # a model directory without prompt.wav gets a generated prompt
SYNTHETIC_RATE = 16000
DOCTOR_TEXT = "Hello, this is a short test of the speech engine."
DEFAULT_RUNS = 3
DEFAULT_TOKENS = 50  # speech tokens per synthesis (2 s of audio): identical work per backend
RUN_HINT = "run `cosyq-worker doctor --json` and attach it to a problem report"
T = TypeVar("T")


@dataclass(frozen=True)
class RunOptions:
    runs: int = DEFAULT_RUNS  # timed calls per stage and whole syntheses per backend
    tokens: int = DEFAULT_TOKENS
    seed: int = 0


@dataclass(frozen=True)
class StageInputs:
    """What every backend gets: the reference's text ids, voice, speech tokens and mel."""

    text_ids: list[int]
    voice: VoicePrompt
    speech: np.ndarray
    mel: np.ndarray
    seed: int


@dataclass(frozen=True)
class StageFigure:
    stage: str
    seconds: float  # best of the timed calls
    max_abs_error: float  # against torch-cpu fp32; 0 for the reference itself
    snr_db: float  # inf when identical

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe: an SNR of +inf (identical outputs) or any NaN becomes null."""
        snr = round(self.snr_db, 2) if math.isfinite(self.snr_db) else None
        error = float(f"{self.max_abs_error:.3g}") if math.isfinite(self.max_abs_error) else None
        return {
            "stage": self.stage,
            "seconds": round(self.seconds, 5),
            "max_abs_error": error,
            "snr_db": snr,
        }


@dataclass(frozen=True)
class BackendFigures:
    """The seed's table for one backend, and its per-stage figures."""

    backend: str
    load_s: float
    first_s: float
    mean_s: float
    peak_rss_gb: float
    stages: tuple[StageFigure, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "load_s": round(self.load_s, 3),
            "first_inference_s": round(self.first_s, 3),
            "mean_inference_s": round(self.mean_s, 3),
            "peak_rss_gb": round(self.peak_rss_gb, 3),
            "stages": [s.as_dict() for s in self.stages],
        }

    def line(self) -> str:
        parts = [f"{s.stage} {s.seconds * 1e3:.1f} ms" + _error(s) for s in self.stages]
        return (
            f"load {self.load_s:.2f} s, first {self.first_s:.3f} s, mean {self.mean_s:.3f} s, "
            f"peak RSS {self.peak_rss_gb:.2f} GB; " + "; ".join(parts)
        )


@dataclass(frozen=True)
class Reference:
    """torch-cpu fp32's inputs and outputs, which every other backend is held against."""

    inputs: StageInputs
    outputs: dict[str, tuple[np.ndarray, float]]


def _error(figure: StageFigure) -> str:
    if math.isinf(figure.snr_db):
        return ""
    return f" (max |err| {figure.max_abs_error:.2g}, SNR {figure.snr_db:.1f} dB)"


class PeakRss:
    """The highest RSS seen by a sampling thread while the `with` block runs."""

    def __init__(self) -> None:
        self.peak = psutil.Process().memory_info().rss
        self._stop = threading.Event()

    def _sample(self) -> None:
        process = psutil.Process()
        while not self._stop.wait(RSS_SAMPLE_S):
            self.peak = max(self.peak, process.memory_info().rss)

    @contextmanager
    def running(self) -> Iterator[PeakRss]:
        thread = threading.Thread(target=self._sample, name="doctor-rss", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._stop.set()
            thread.join()
            self.peak = max(self.peak, psutil.Process().memory_info().rss)

    @property
    def gb(self) -> float:
        return self.peak / 1e9


def prompt_audio(root: Path) -> tuple[np.ndarray, int, str]:
    """The directory's prompt.wav and prompt.txt, else a generated 3 s voiced signal."""
    if (root / PROMPT_AUDIO).is_file():
        samples, rate = soundfile.read(root / PROMPT_AUDIO, dtype="float32")
        text = root / PROMPT_TEXT
        return samples, int(rate), text.read_text().strip() if text.is_file() else ""
    t = np.arange(int(SYNTHETIC_PROMPT_S * SYNTHETIC_RATE)) / SYNTHETIC_RATE
    pitch = 120 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / SYNTHETIC_RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    noise = np.random.default_rng(0).normal(0, 0.01, t.size)
    return (0.2 * voiced + noise).astype(np.float32), SYNTHETIC_RATE, ""


def reference_inputs(
    reference: SynthesisPipeline, root: Path, tokens: int, seed: int
) -> StageInputs:
    """The inputs every backend gets, made once by the torch-cpu fp32 engine."""
    samples, rate, transcript = prompt_audio(root)
    voice = reference.extract_voice(samples, rate, transcript)
    ids = list(reference.frontend.pieces(DOCTOR_TEXT)[0].ids)
    speech = reference.llm.generate(
        ids,
        prompt_text=[],
        prompt_speech=voice.speech_tokens,
        generator=torch.Generator().manual_seed(seed),
        forced_length=tokens,
    ).ids
    mel = reference.flow.mel(speech, voice)
    return StageInputs(ids, voice, speech, mel, seed)


def _best(call: Callable[[], T], runs: int) -> tuple[T, float]:
    """Run once to warm up, then `runs` timed calls; the last output and the best time."""
    out = call()
    best = math.inf
    for _ in range(max(1, runs)):
        start = time.perf_counter()
        out = call()
        best = min(best, time.perf_counter() - start)
    return out, best


def stage_outputs(
    engine: SynthesisPipeline, inputs: StageInputs, runs: int
) -> dict[str, tuple[np.ndarray, float]]:
    """Each stage's output on `inputs` and its best time."""
    llm = _best(lambda: first_step_logp(engine, inputs.text_ids, inputs.voice), runs)
    flow = _best(lambda: engine.flow.mel(inputs.speech, inputs.voice), runs)

    def vocoder() -> np.ndarray:
        return engine.vocoder.waveform(inputs.mel, torch.Generator().manual_seed(inputs.seed))

    return {"LLM step": llm, "flow": flow, "HiFT": _best(vocoder, runs)}


def compare(
    outputs: dict[str, tuple[np.ndarray, float]], reference: dict[str, tuple[np.ndarray, float]]
) -> tuple[StageFigure, ...]:
    figures = []
    for stage in STAGES:
        out, seconds = outputs[stage]
        ref = reference[stage][0]
        n = min(out.size, ref.size)
        diff = np.abs(out.reshape(-1)[:n].astype(np.float64) - ref.reshape(-1)[:n])
        figures.append(StageFigure(stage, seconds, float(diff.max(initial=0.0)), snr_db(ref, out)))
    return tuple(figures)


def seed_table(engine: SynthesisPipeline, inputs: StageInputs, runs: int) -> tuple[float, float]:
    """(first inference s, mean inference s) of one whole synthesis on the reference voice."""
    request = SynthesisInput(text=DOCTOR_TEXT, prompt=inputs.voice, seed=inputs.seed)
    start = time.perf_counter()
    engine.run(request)
    first = time.perf_counter() - start
    times = []
    for _ in range(max(1, runs)):
        start = time.perf_counter()
        engine.run(request)
        times.append(time.perf_counter() - start)
    return first, sum(times) / len(times)
