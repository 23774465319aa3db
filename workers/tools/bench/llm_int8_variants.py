"""`cosyq-worker bench llm --llm-precision int8 --variants`: what moves the int8 step's speed
and its agreement with fp32, every figure from one process (the host is noisy: ratios only).

On the FULL random LLM at `threads`: fp32's decode ms/token (the baseline, timed first and
again last), then for each quantization scheme (`QuantScheme`: block size, accuracy_level,
symmetric or not, head in int8 or fp32) and each session tuning (`SessionTuning`: spinning,
graph optimisation level) its prefill, ms/token and, for the schemes, its accuracy against
fp32: centred log-prob SNR, the sampled tokens' agreement teacher-forced and free-running, the
greedy agreement and the nucleus overlap (1 - TV, the most a shared draw can agree). The
yardsticks: fp32 against itself at 1 thread, and bf16 against fp32, on the same checks.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from shared.logs import get_logger
from workers.model.llm.model import Qwen2LM, SpeechLM
from workers.model.llm.ort_decoder import SessionTuning, load_ort_llm
from workers.model.llm.ort_graph import QuantScheme
from workers.model.llm.qwen2 import KVCache
from workers.tools.bench.llm_agreement import agreement_of, compare_llm, free_tokens
from workers.tools.bench.llm_stage import DTYPES, _prompt, time_decode, time_prefill
from workers.tools.fixtures.random_weights import build_random_llm, full_llm_config

log = get_logger(__name__)

SCHEMES: tuple[tuple[str, QuantScheme], ...] = (
    ("b32 acc4 sym head8 (shipped)", QuantScheme()),
    ("head fp32", QuantScheme(head_int8=False)),
    ("block 128", QuantScheme(block=128)),
    ("acc0", QuantScheme(accuracy_level=0)),
    ("acc1", QuantScheme(accuracy_level=1)),
    ("asymmetric", QuantScheme(symmetric=False)),
)
TUNINGS: tuple[tuple[str, SessionTuning], ...] = (
    ("spinning", SessionTuning(spinning=True)),
    ("opt extended", SessionTuning(optimization="extended")),
    ("opt basic", SessionTuning(optimization="basic")),
)


class ThreadsLM:
    """`model` whose steps run at `threads` torch threads (the process's count restored)."""

    def __init__(self, model: Qwen2LM, threads: int) -> None:
        self.model, self.threads = model, threads
        self.config = model.config

    @property
    def speech_embedding(self) -> nn.Embedding:
        return self.model.speech_embedding

    @property
    def device(self) -> torch.device:
        return self.model.device

    def prefix_embeddings(
        self, text: torch.Tensor, prompt_text: torch.Tensor, prompt_speech: torch.Tensor
    ) -> torch.Tensor:
        return self.model.prefix_embeddings(text, prompt_text, prompt_speech)

    def step_logp(self, inputs_embeds: torch.Tensor, cache: KVCache) -> torch.Tensor:
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            return self.model.step_logp(inputs_embeds, cache)
        finally:
            torch.set_num_threads(before)


@dataclass(frozen=True)
class VariantRow:
    name: str
    prefill_s: float | None = None
    ms_per_token: float | None = None
    centred_db: float | None = None  # median over the prefill and 20 steps
    teacher_forced: float | None = None  # share of 200 steps
    free_running: float | None = None
    first_divergence: int | None = None
    greedy: float | None = None
    id_ordered: float | None = None
    overlap: float | None = None
    load: float = 0.0

    def line(self, fp32_ms: float) -> str:
        def f(value: float | None, spec: str) -> str:
            return "-" if value is None else format(value, spec)

        ratio = None if self.ms_per_token is None else self.ms_per_token / fp32_ms
        return (
            f"{self.name:<30}{f(self.prefill_s, '.3f'):>8}{f(self.ms_per_token, '.1f'):>9}"
            f"{f(ratio, '.2f'):>7}{f(self.centred_db, '.1f'):>7}"
            f"{f(self.teacher_forced, '.1%'):>8}{f(self.free_running, '.1%'):>8}"
            f"{f(self.first_divergence, 'd'):>6}{f(self.greedy, '.1%'):>8}"
            f"{f(self.id_ordered, '.1%'):>8}"
            f"{f(self.overlap, '.1%'):>8}{self.load:>6.2f}"
        )


HEADER = (
    f"{'variant':<30}{'prefill':>8}{'ms/tok':>9}{'/fp32':>7}{'dB':>7}{'forced':>8}{'free':>8}"
    f"{'div@':>6}{'greedy':>8}{'id-ord':>8}{'1-TV':>8}{'load':>6}"
)


@contextmanager
def _scratch(cache_dir: Path | None) -> Iterator[Path]:
    if cache_dir is not None:
        yield cache_dir
        return
    with tempfile.TemporaryDirectory(prefix="cosyq-int8-") as scratch:
        yield Path(scratch)


def _speed(model: object, prompt: tuple, tokens: int, runs: int) -> tuple[float, float]:
    time_prefill(model, prompt)  # type: ignore[arg-type]  # warm-up
    prefill = min(time_prefill(model, prompt) for _ in range(runs))  # type: ignore[arg-type]
    per_token = min(time_decode(model, prompt, tokens) for _ in range(runs))  # type: ignore[arg-type]
    return prefill, per_token * 1e3


class _Accuracy:
    """The checks against fp32 for one other model (fp32's free-running ids computed once)."""

    def __init__(self, fp32: Qwen2LM, prefix: torch.Tensor, steps: int) -> None:
        self.fp32, self.prefix, self.steps = fp32, prefix, steps
        self.reference_ids = free_tokens(fp32, prefix, steps, seed=0)

    def row(self, name: str, other: SpeechLM, **speed: float) -> VariantRow:
        forced = compare_llm(self.fp32, other, self.prefix, steps=self.steps, seed=0)
        free = agreement_of(self.reference_ids, free_tokens(other, self.prefix, self.steps, 0))
        return VariantRow(
            name,
            centred_db=statistics.median(forced.snr_db[:21]),
            teacher_forced=forced.share,
            free_running=free.agreed / free.steps,
            first_divergence=free.first_divergence,
            greedy=forced.greedy_agreed / forced.steps,
            id_ordered=forced.id_ordered_agreed / forced.steps,
            overlap=statistics.fmean(forced.overlap),
            load=os.getloadavg()[0],
            **speed,
        )


def bench_variants(
    *,
    threads: int = 2,
    prefill_positions: int = 42,
    decode_tokens: int = 40,
    runs: int = 2,
    steps: int = 200,
    cache_dir: Path | None = None,
    only: tuple[str, ...] = (),
) -> list[VariantRow]:
    """The rows in the order measured: fp32 first and last, then schemes, tunings, yardsticks;
    `only`: the variants whose names contain one of these (fp32's rows always run)."""

    def wanted(name: str) -> bool:
        return not only or any(part in name for part in only)

    torch.set_num_threads(threads)
    config = full_llm_config()
    prompt = _prompt(config, prefill_positions)
    fp32 = build_random_llm(config, dtype=torch.float32)
    ids = [torch.tensor(p, dtype=torch.long) for p in prompt]
    with torch.inference_mode():
        prefix = fp32.prefix_embeddings(*ids)
    accuracy = _Accuracy(fp32, prefix, steps)
    rows = [_timed_row("fp32 (PyTorch)", fp32, prompt, decode_tokens, runs)]
    with _scratch(cache_dir) as folder:
        for name, scheme in filter(lambda item: wanted(item[0]), SCHEMES):
            start = time.perf_counter()
            ort = load_ort_llm(
                fp32, cache_dir=folder, checkpoint_hash="random0", threads=threads, scheme=scheme
            )
            log.info("int8_variant_built", variant=name, seconds=time.perf_counter() - start)
            prefill, ms = _speed(ort, prompt, decode_tokens, runs)
            rows.append(accuracy.row(name, ort, prefill_s=prefill, ms_per_token=ms))
            log.info("int8_variant", **rows[-1].__dict__)
            del ort
        for name, tuning in filter(lambda item: wanted(item[0]), TUNINGS):
            ort = load_ort_llm(
                fp32, cache_dir=folder, checkpoint_hash="random0", threads=threads, tuning=tuning
            )
            rows.append(_timed_row(name, ort, prompt, decode_tokens, runs))
            del ort
    rows.append(_timed_row("fp32 (PyTorch), again", fp32, prompt, decode_tokens, runs))
    if wanted("yardstick: fp32 at 1 thread"):
        rows.append(accuracy.row("yardstick: fp32 at 1 thread", ThreadsLM(fp32, 1)))
    if wanted("yardstick: bf16 (PyTorch)"):
        bf16 = build_random_llm(config, dtype=DTYPES["bf16"])
        rows.append(accuracy.row("yardstick: bf16 (PyTorch)", bf16))
    return rows


def _timed_row(name: str, model: object, prompt: tuple, tokens: int, runs: int) -> VariantRow:
    prefill, ms = _speed(model, prompt, tokens, runs)
    row = VariantRow(name, prefill_s=prefill, ms_per_token=ms, load=os.getloadavg()[0])
    log.info("int8_variant", **row.__dict__)
    return row


def format_variants(rows: list[VariantRow]) -> list[str]:
    fp32 = rows[0].ms_per_token or 1.0
    return [HEADER, *(row.line(fp32) for row in rows)]
