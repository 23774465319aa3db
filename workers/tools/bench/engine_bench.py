"""`cosyq-worker bench`: the whole engine, load to samples, on one machine, as a printed table.

Measures: model load, first inference, mean and p95 over R runs of a fixed
text, audio seconds, RTF, RSS after load and peak RSS, and per stage (frontend, LLM prefill and
tokens/s, flow, HiFT). Models: `tiny` (written to a temporary folder), `full-random` (the FULL
architecture with random weights, written once to a cache folder by a child process, loaded
through the real loader; every piece gets exactly `tokens` speech tokens with stop ids masked),
or a model directory. A fresh process per bench keeps RSS figures honest.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import soundfile
import torch

from workers.engine.api import SynthesisInput
from workers.engine.cpu_features import HostCPU, host_cpu
from workers.engine.pipeline import EngineOptions, SynthesisPipeline, build_engine, engine_output
from workers.engine.quality import tail_repetition
from workers.engine.requests import RequestState
from workers.service.quality import QualityPolicy, judge
from workers.tools.bench import DEFAULT_TEXT
from workers.tools.bench.floors import Floors, measure_floors, stage_precisions
from workers.tools.bench.precision import PrecisionReport, compare_precision, llm_agreement

FULL_RANDOM_TOKENS = 100  # 4 s of audio, as in the table upstream was measured with
DEFAULT_CACHE = Path.home() / ".cache" / "cosyq" / "full-random"  # ~2.5 GB, written once
DEFAULT_HASH_CACHE = Path.home() / ".cache" / "cosyq" / "hashes"  # as the worker's default
COMPARE_TOKENS = 50  # speech tokens fed to both precisions when none are forced
AGREEMENT_STEPS = 200  # int8 LLM: teacher-forced steps whose sampled tokens are compared
QUALITY_SHARE_TARGET = 0.01  # issue 25: the quality measures add under 1% to a job


@dataclass(frozen=True)
class BenchOptions:
    config: str = "tiny"  # "tiny" | "full-random"
    family: str = "cosyvoice2"  # "cosyvoice2" | "cosyvoice3": which architecture `config` writes
    model_dir: Path | None = None  # a model directory instead of `config`
    device: str = "cpu"
    dtype: str = "fp32"
    threads: int = 2
    runs: int = 5
    text: str = DEFAULT_TEXT
    tokens: int | None = None  # forced speech tokens per piece (full-random: 100)
    seed: int = 0
    cache_dir: Path = DEFAULT_CACHE
    hash_cache_dir: Path = DEFAULT_HASH_CACHE
    compare_fp32: bool = False  # also load an fp32 engine and report per-stage SNR
    floors: bool = True  # measure the machine's rates and each stage's floor (CPU only)
    omp_wait_policy: str = "(unset)"  # as in force for this process (reported)
    llm_precision: str = "native"  # "int8": the LLM step in ONNX Runtime (COSYQ_LLM_PRECISION)

    @classmethod
    def from_args(cls, args: Any, **extra: Any) -> BenchOptions:
        """The options the bench commands share, from their parsed arguments (those a command
        has and gave), plus `extra`."""
        given = {name: getattr(args, name, None) for name in SHARED_ARGUMENTS}
        return cls(**{name: value for name, value in given.items() if value is not None}, **extra)


SHARED_ARGUMENTS = (
    "config",
    "family",
    "model_dir",
    "device",
    "dtype",
    "threads",
    "text",
    "tokens",
    "seed",
    "cache_dir",
    "llm_precision",
)


@dataclass(frozen=True)
class RunFigures:
    """One synthesis: wall seconds and what the request's state recorded."""

    wall_s: float
    audio_s: float
    stages: dict[str, float]
    speech_tokens: int
    pieces: int
    first_token_s: float
    quality_s: float = 0.0  # every quality measure and the verdict on this run's output

    @classmethod
    def of(
        cls,
        wall_s: float,
        samples: np.ndarray,
        rate: int,
        state: RequestState,
        quality_s: float = 0.0,
    ) -> RunFigures:
        return cls(
            wall_s=wall_s,
            audio_s=samples.shape[0] / rate,
            stages=dict(state.clock.seconds),
            speech_tokens=state.speech_tokens,
            pieces=state.pieces,
            first_token_s=state.llm_first_token_s,
            quality_s=quality_s,
        )

    @property
    def ms_per_token(self) -> float:
        """LLM decode time per token after each piece's first (which includes the prefill)."""
        decoded = self.speech_tokens - self.pieces
        return 1e3 * (self.stages["llm"] - self.first_token_s) / decoded if decoded > 0 else 0.0


@dataclass(frozen=True)
class BenchResult:
    options: BenchOptions
    model: str
    device: str
    load_s: float
    voice_s: float
    prefill_positions: int  # the first piece's LLM prefix: SOS, texts, TASK_ID, prompt speech
    rss_after_load_gb: float
    peak_rss_gb: float
    first: RunFigures
    runs: tuple[RunFigures, ...]
    load_average: tuple[float, float]  # 1-minute load average before and after (shared hosts)
    omp_wait_policy: str
    host: HostCPU
    precisions: dict[str, str]  # the dtype each stage computes in
    floors: Floors | None = None
    precision: PrecisionReport | None = None

    @property
    def mean_s(self) -> float:
        return statistics.fmean(r.wall_s for r in self.runs)

    @property
    def p95_s(self) -> float:
        return float(np.percentile([r.wall_s for r in self.runs], 95))

    @property
    def audio_s(self) -> float:
        return self.runs[0].audio_s

    @property
    def rtf(self) -> float:
        return self.mean_s / self.audio_s if self.audio_s > 0 else 0.0

    def stage_mean(self, stage: str) -> float:
        return statistics.fmean(r.stages[stage] for r in self.runs)

    @property
    def ms_per_token(self) -> float:
        return statistics.fmean(r.ms_per_token for r in self.runs)

    @property
    def first_token_s(self) -> float:
        return statistics.fmean(r.first_token_s for r in self.runs)

    @property
    def quality_s(self) -> float:
        return statistics.fmean(r.quality_s for r in self.runs)

    @property
    def quality_share(self) -> float:
        """The quality measures' cost against the job's synthesis wall time, run by run."""
        return statistics.fmean(r.quality_s / r.wall_s for r in self.runs if r.wall_s > 0)


def peak_rss_gb() -> float:
    """The process's peak resident set (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e9 if sys.platform == "darwin" else peak * 1024 / 1e9


FULL_RANDOM_DIRS = {"cosyvoice2": "model", "cosyvoice3": "model-cosyvoice3"}  # in cache_dir


def model_directory(options: BenchOptions, workdir: Path) -> Path:
    """`model_dir`, or `config` of `family`: tiny in `workdir`, full-random in the cache (one
    folder per family, so neither overwrites the other)."""
    if options.model_dir is not None:
        return options.model_dir
    if options.config == "full-random":
        root = options.cache_dir / FULL_RANDOM_DIRS[options.family]
        from workers.tools.fixtures.full_random import ensure_random_model  # noqa: PLC0415

        return ensure_random_model(
            root, family=options.family, hash_cache_dir=options.hash_cache_dir
        )
    if options.family == "cosyvoice3":
        from workers.tools.fixtures.tiny3 import write_tiny3_model  # noqa: PLC0415

        return write_tiny3_model(workdir / "tiny3").root
    from workers.tools.fixtures.tiny import write_tiny_model  # noqa: PLC0415

    return write_tiny_model(workdir / "tiny").root


def forced_tokens(options: BenchOptions) -> int | None:
    if options.tokens is not None:
        return options.tokens
    return FULL_RANDOM_TOKENS if options.config == "full-random" and not options.model_dir else None


def bench_engine_and_request(
    options: BenchOptions, workdir: Path
) -> tuple[Path, SynthesisPipeline, SynthesisInput]:
    """The model directory of `options` (made in `workdir` when it is a temporary one), its
    engine, and the request the benches time: `options.text` in the directory's own voice."""
    root = model_directory(options, workdir)
    engine = build_engine(
        root,
        device=options.device,
        dtype=options.dtype,
        options=engine_options(options),  # forced tokens, and the LLM precision asked for
        hash_cache_dir=workdir / "hashes",
    )
    samples, rate = soundfile.read(root / "prompt.wav", dtype="float32")
    voice = engine.extract_voice(samples, int(rate), (root / "prompt.txt").read_text())
    return root, engine, SynthesisInput(text=options.text, prompt=voice, seed=options.seed)


def prefill_positions(engine: SynthesisPipeline, request: SynthesisInput) -> int:
    """Positions the LLM prefills for the first piece of `request` (zero_shot)."""
    piece = engine.frontend.pieces(request.text)[0]
    prompt_text = engine.frontend.prompt_text_ids(request.prompt.transcript)
    return 2 + len(prompt_text) + len(piece.ids) + int(request.prompt.speech_tokens.shape[0])


def _timed_run(engine: SynthesisPipeline, request: SynthesisInput) -> RunFigures:
    """One synthesis, then the quality check a worker runs on its output (timed apart)."""
    start = time.perf_counter()
    samples, state = engine.run(request)
    wall_s = time.perf_counter() - start
    start = time.perf_counter()
    judge(engine_output(samples, engine.sample_rate, state), QualityPolicy())
    quality_s = time.perf_counter() - start + tail_repeat_seconds(state)
    return RunFigures.of(wall_s, samples, engine.sample_rate, state, quality_s)


def tail_repeat_seconds(state: RequestState) -> float:
    """The engine's own quality measure (each piece's tail repetition, inside its LLM stage
    and so inside `wall_s`), timed again on token arrays of each piece's length: its cost
    does not depend on the token values, and the run does not keep them."""
    ids = [np.arange(span.speech_tokens, dtype=np.int64) for span in state.spans]
    start = time.perf_counter()
    for piece in ids:
        tail_repetition(piece)
    return time.perf_counter() - start


def run_bench(options: BenchOptions) -> BenchResult:
    """Load, extract the directory's prompt, run once (first), then `runs` timed runs."""
    torch.set_num_threads(options.threads)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="cosyq-bench-") as workdir:
        root = model_directory(options, Path(workdir))
        temporary = options.model_dir is None and options.config == "tiny"
        start = time.perf_counter()
        engine = build_engine(
            root,
            device=options.device,
            dtype=options.dtype,
            options=engine_options(options),
            hash_cache_dir=Path(workdir) / "hashes" if temporary else options.hash_cache_dir,
        )
        load_s = time.perf_counter() - start
        rss_after_load = psutil.Process().memory_info().rss / 1e9
        samples, rate = soundfile.read(root / "prompt.wav", dtype="float32")
        start = time.perf_counter()
        voice = engine.extract_voice(samples, int(rate), (root / "prompt.txt").read_text())
        voice_s = time.perf_counter() - start
        request = SynthesisInput(text=options.text, prompt=voice, seed=options.seed)
        prefill = prefill_positions(engine, request)
        first = _timed_run(engine, request)
        runs = tuple(_timed_run(engine, request) for _ in range(options.runs))
        peak = peak_rss_gb()  # before the floors' buffers and a comparison engine
        precisions = stage_precisions(engine)
        floors = _floors(options, engine, voice, first, precisions)
        precision = None
        if options.compare_fp32 and (options.dtype != "fp32" or options.llm_precision == "int8"):
            precision = _compare(options, root, engine, request, Path(workdir))
    return BenchResult(
        options=options,
        model=engine.identity.name,
        device=engine.identity.device,
        load_s=load_s,
        voice_s=voice_s,
        prefill_positions=prefill,
        rss_after_load_gb=rss_after_load,
        peak_rss_gb=peak,
        first=first,
        runs=runs,
        load_average=(load_before, os.getloadavg()[0]),
        omp_wait_policy=options.omp_wait_policy,
        host=host_cpu(),
        precisions=precisions,
        floors=floors,
        precision=precision,
    )


def engine_options(options: BenchOptions) -> EngineOptions:
    return EngineOptions(
        forced_speech_tokens=forced_tokens(options),
        llm_precision=options.llm_precision,
        ort_cache_dir=options.cache_dir / "onnx",
    )


def _floors(
    options: BenchOptions,
    engine: SynthesisPipeline,
    voice: Any,
    first: RunFigures,
    precisions: dict[str, str],
) -> Floors | None:
    """One piece's floors (the run's pieces are alike here), on CPU only."""
    if not options.floors or not engine.identity.device.startswith("cpu"):
        return None
    tokens = max(1, first.speech_tokens // max(1, first.pieces))
    return measure_floors(engine, voice, tokens, precisions)


def _compare(
    options: BenchOptions,
    root: Path,
    engine: SynthesisPipeline,
    request: SynthesisInput,
    workdir: Path,
) -> PrecisionReport:
    reference = build_engine(root, device=options.device, dtype="fp32", hash_cache_dir=workdir)
    int8 = options.llm_precision == "int8"
    report = compare_precision(
        reference,
        engine,
        dtype=f"{options.dtype}, LLM int8" if int8 else options.dtype,
        request=request,
        tokens=forced_tokens(options) or COMPARE_TOKENS,
        seed=options.seed,
    )
    if not int8:
        return report
    agreement = llm_agreement(reference, engine, request, steps=AGREEMENT_STEPS, seed=options.seed)
    return dataclasses.replace(report, llm_agreement=agreement)
