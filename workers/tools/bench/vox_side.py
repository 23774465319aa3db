"""`cosyq-worker bench vox`: the LLM's time per speech token, vox against cosyq, in one run.

What is compared (vox cannot be made to speak a given number of tokens: its CosyVoice runs
until the end-of-speech token or 20 tokens per text token, and its `max_new_tokens` is
Chatterbox's; random weights end wherever they end):
- vox: its own LLM clock, `Engine.stats()["backend"]["llm_ms"]` (summed over the run: the
  prefill, every decode step and the sampling), over the tokens the run made, which are the
  audio's samples / 960 (25 speech tokens per second at 24 kHz);
- cosyq: the engine's `llm` stage clock over the same run (prefill, every decode step,
  sampling), its token count forced to what vox q8 made on a first, untimed run.
Both see the same text, the same prompt features (cosyq's own, written into vox's voice file:
`vox_models`), the same seed and 2 threads; runs are interleaved engine by engine, and each
engine's best run is compared (the median is printed too). cosyq's flow takes one Euler step
(its time is not compared; vox's flow runs its 10 between vox's LLM runs).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import soundfile
import torch

from workers.engine.api import SynthesisInput
from workers.engine.auto_dtype import choose_dtype
from workers.engine.cpu_features import HostCPU, host_cpu
from workers.engine.pipeline import EngineOptions, SynthesisPipeline, build_engine
from workers.tools.bench.vox_models import (
    SAMPLES_PER_TOKEN,
    VoxModel,
    convert,
    import_vox,
    vox_version,
    write_vox_voice,
)

DEFAULT_TEXT = "Hello there."  # 5 text tokens in CosyVoice 2's tokenizer: up to 100 speech tokens
MEASURE = (
    "LLM stage time per speech token, prefill included: vox = stats()['backend']['llm_ms'] "
    "over the run's tokens (audio samples / 960); cosyq = its llm stage clock over the same "
    "number of tokens (forced to vox q8's count)"
)


@dataclass(frozen=True)
class SideBySideOptions:
    model_dir: Path
    cache_dir: Path  # vox's converted models (and cosyq's int8 graphs under onnx/)
    hash_cache_dir: Path
    text: str = DEFAULT_TEXT
    threads: int = 2
    runs: int = 3
    seed: int = 0
    vox_precisions: tuple[str, ...] = ("q8", "bf16")
    ours: tuple[str, ...] = ("native", "int8")  # cosyq's LLM precisions
    omp_wait_policy: str = "(unset)"  # as in force for this process (reported)

    def __post_init__(self) -> None:
        if self.runs < 1 or self.threads < 1:
            raise ValueError("runs and threads must be at least 1")
        if "q8" not in self.vox_precisions:
            raise ValueError("vox q8 is the reference: keep it in vox_precisions")


class LLMRunner(Protocol):
    label: str  # "vox q8", "cosyq fp32", ...

    def run(self, seed: int) -> tuple[int, float]:
        """One synthesis -> (speech tokens made, LLM seconds)."""
        ...


class VoxRunner:
    def __init__(self, vox: Any, model: VoxModel, voice: Path, text: str, threads: int) -> None:
        self.label = f"vox {model.precision}"
        self.engine = vox.Engine(str(model.path), device="cpu", threads=threads)
        self.voice = self.engine.load_voice(str(voice))
        self.text = text

    def _llm_ms(self) -> float:
        return float(self.engine.stats()["backend"]["llm_ms"])  # summed over the engine's life

    def run(self, seed: int) -> tuple[int, float]:
        before = self._llm_ms()
        audio = self.engine.synthesize(self.text, self.voice, seed=seed)
        return audio.shape[0] // SAMPLES_PER_TOKEN, (self._llm_ms() - before) / 1e3


class CosyqRunner:
    def __init__(
        self, label: str, engine: SynthesisPipeline, request: SynthesisInput, tokens: int
    ) -> None:
        self.label = label
        self.engine = engine
        self.request = request
        self.tokens = tokens  # forced: stop ids masked until exactly this many

    def run(self, seed: int) -> tuple[int, float]:
        request = dataclasses.replace(self.request, seed=seed)
        _, state = self.engine.run(request, forced_length=self.tokens)
        return state.speech_tokens, state.clock.seconds["llm"]


@dataclass(frozen=True)
class EngineTiming:
    label: str
    tokens: tuple[int, ...]  # per timed run
    ms_per_token: tuple[float, ...]  # per timed run

    @property
    def best(self) -> float:
        return min(self.ms_per_token)

    @property
    def median(self) -> float:
        return statistics.median(self.ms_per_token)


@dataclass(frozen=True)
class SideBySide:
    options: SideBySideOptions
    timings: tuple[EngineTiming, ...]
    forced_tokens: int  # what vox q8 made on its untimed run; cosyq makes exactly this many
    text_tokens: int  # cosyq's count for the text (vox's tokenizer reads the same files)
    host: HostCPU
    load_average: tuple[float, float]  # 1-minute, before and after the timed runs
    vox_version: str
    conversions: tuple[VoxModel, ...]
    native_dtype: str

    def timing(self, label: str) -> EngineTiming:
        return next(t for t in self.timings if t.label == label)

    def ratios(self) -> list[tuple[str, str, float, float]]:
        """(cosyq label, vox label, best ratio, median ratio) for every pair; < 1: cosyq is
        faster per token."""
        ours = [t for t in self.timings if t.label.startswith("cosyq")]
        theirs = [t for t in self.timings if t.label.startswith("vox")]
        return [
            (o.label, v.label, o.best / v.best, o.median / v.median) for o in ours for v in theirs
        ]


def cosyq_engines(options: SideBySideOptions, native: str) -> dict[str, SynthesisPipeline]:
    """cosyq's engines by label, one per LLM precision (the flow takes one Euler step)."""
    engines = {}
    for precision in options.ours:
        label = f"cosyq {native if precision == 'native' else precision}"
        engines[label] = build_engine(
            options.model_dir,
            device="cpu",
            dtype=native,
            options=EngineOptions(
                flow_steps=1, llm_precision=precision, ort_cache_dir=options.cache_dir / "onnx"
            ),
            hash_cache_dir=options.hash_cache_dir,
        )
    return engines


def prompt_request(engine: SynthesisPipeline, options: SideBySideOptions) -> SynthesisInput:
    """The directory's prompt.wav and prompt.txt as cosyq's voice, with the options' text."""
    root = options.model_dir
    samples, rate = soundfile.read(root / "prompt.wav", dtype="float32")
    voice = engine.extract_voice(samples, int(rate), (root / "prompt.txt").read_text())
    return SynthesisInput(text=options.text, prompt=voice, seed=options.seed)


def interleave(
    runners: Sequence[LLMRunner], runs: int, seed: int, on_run: Callable[[str], None]
) -> tuple[EngineTiming, ...]:
    """`runs` rounds, each engine once per round in turn (host noise spreads over all)."""
    figures: dict[str, list[tuple[int, float]]] = {r.label: [] for r in runners}
    for round_index in range(runs):
        for runner in runners:
            tokens, seconds = runner.run(seed)
            figures[runner.label].append((tokens, 1e3 * seconds / max(tokens, 1)))
            on_run(f"round {round_index + 1}/{runs}: {runner.label} {tokens} tokens")
    return tuple(
        EngineTiming(label, tuple(t for t, _ in runs_), tuple(ms for _, ms in runs_))
        for label, runs_ in figures.items()
    )


def run_side_by_side(
    options: SideBySideOptions, on_run: Callable[[str], None] = lambda _: None
) -> SideBySide:
    vox = import_vox()
    torch.set_num_threads(options.threads)
    native = choose_dtype(torch.device("cpu")).name
    models = tuple(
        convert(options.model_dir, options.cache_dir / "vox", p) for p in options.vox_precisions
    )
    engines = cosyq_engines(options, native)
    first = next(iter(engines.values()))
    request = prompt_request(first, options)
    voice = write_vox_voice(  # beside the models: their cache folder is this model's own
        models[0].path,
        request.prompt,
        first.frontend.prompt_text_ids(request.prompt.transcript),
        models[0].path.parent / "prompt.tvoice",
    )
    vox_runners = [VoxRunner(vox, m, voice, options.text, options.threads) for m in models]
    q8 = next(r for r in vox_runners if r.label == "vox q8")  # options keep q8
    forced, _ = q8.run(options.seed)  # untimed warm-up; fixes cosyq's token count
    on_run(f"vox q8 made {forced} speech tokens: cosyq is forced to {forced}")
    ours = [CosyqRunner(label, e, request, forced) for label, e in engines.items()]
    runners: list[LLMRunner] = [*vox_runners, *ours]
    for runner in runners:
        if runner is not q8:
            runner.run(options.seed)  # warm-up (kernel choice, page faults)
    load_before = os.getloadavg()[0]
    timings = interleave(runners, options.runs, options.seed, on_run)
    return SideBySide(
        options=options,
        timings=timings,
        forced_tokens=forced,
        text_tokens=sum(len(p.ids) for p in first.frontend.pieces(options.text)),
        host=host_cpu(),
        load_average=(load_before, os.getloadavg()[0]),
        vox_version=vox_version(),
        conversions=models,
        native_dtype=native,
    )
