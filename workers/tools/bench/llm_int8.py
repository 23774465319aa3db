"""`cosyq-worker bench llm --llm-precision int8`: the int8 ONNX Runtime step beside PyTorch's
fp32 and bf16 on the FULL random LLM, in one run (ratios from one run only: the host is noisy).

Prints per precision: prefill and batch-1 decode ms/token (best of runs, each run a forced
decode with stop ids masked); for int8 its floor (the graph's weight bytes per step, int8 plus
scales and the float32 biases, over the measured read bandwidth); batched int8 decode steps per
row at the batch sizes asked; and the int8 step's accuracy against fp32 (`llm_agreement`).
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from shared.logs import get_logger
from workers.model.llm.model import Qwen2LM
from workers.model.llm.ort_decoder import OrtSpeechLM, load_ort_llm
from workers.tools.bench.floors import memory_bandwidth_gbs
from workers.tools.bench.llm_agreement import LLMAgreement, compare_llm, free_running
from workers.tools.bench.llm_stage import DTYPES, _prompt, time_decode, time_prefill
from workers.tools.fixtures.random_weights import (
    build_random_llm,
    family_llm_config,
    full_llm_config,
)

log = get_logger(__name__)

BATCH_CONTEXT = 200  # positions already in each row when a batched step is timed
BATCH_STEPS = 20


@dataclass(frozen=True)
class PrecisionTiming:
    name: str
    prefill_s: float
    ms_per_token: float


@dataclass(frozen=True)
class Int8Report:
    timings: tuple[PrecisionTiming, ...]
    weight_bytes: int
    bandwidth_gbs: float
    batched_ms_per_row: dict[int, float]
    agreement: LLMAgreement
    build_s: float

    @property
    def floor_ms(self) -> float:
        return self.weight_bytes / (self.bandwidth_gbs * 1e9) * 1e3

    def lines(self) -> list[str]:
        int8 = next(t for t in self.timings if t.name == "int8")
        out = [f"{'precision':<10}{'prefill s':>11}{'ms/token':>10}{'int8 ratio':>12}"]
        for t in self.timings:
            ratio = int8.ms_per_token / t.ms_per_token
            out.append(f"{t.name:<10}{t.prefill_s:>11.3f}{t.ms_per_token:>10.1f}{ratio:>12.2f}")
        out.append(
            f"int8 floor: {self.weight_bytes / 1e6:.0f} MB per step at {self.bandwidth_gbs:.1f} "
            f"GB/s = {self.floor_ms:.1f} ms; int8 at {int8.ms_per_token / self.floor_ms:.2f}x "
            f"its floor (graph built in {self.build_s:.1f} s)"
        )
        for batch, ms in sorted(self.batched_ms_per_row.items()):
            out.append(f"int8 batched decode B={batch}: {ms:.2f} ms per row and step")
        return [*out, *self.agreement.lines()]


def time_batched(ort_llm: OrtSpeechLM, batch: int, runs: int) -> float:
    """ms per row of one batched decode step, rows `BATCH_CONTEXT` long (best of runs)."""
    hidden = ort_llm.config.backbone.hidden_size
    kv = ort_llm.new_kv(batch, BATCH_CONTEXT + BATCH_STEPS * (runs + 1))
    embeds = np.random.default_rng(0).standard_normal((batch, 1, hidden)).astype(np.float32)
    lengths = np.full(batch, BATCH_CONTEXT, dtype=np.int32)
    best = float("inf")
    for _ in range(runs + 1):
        start = time.perf_counter()
        for _ in range(BATCH_STEPS):
            ort_llm.run_rows(kv, embeds * 0.02, lengths)
            lengths += 1
        best = min(best, (time.perf_counter() - start) / BATCH_STEPS / batch * 1e3)
    return best


def _timing(name: str, model: object, prompt: tuple, tokens: int, runs: int) -> PrecisionTiming:
    time_prefill(model, prompt)  # type: ignore[arg-type]  # warm-up
    prefill = min(time_prefill(model, prompt) for _ in range(runs))  # type: ignore[arg-type]
    per_token = min(time_decode(model, prompt, tokens) for _ in range(runs))  # type: ignore[arg-type]
    log.info("bench_llm_timed", precision=name, prefill_s=prefill, ms_per_token=per_token * 1e3)
    return PrecisionTiming(name, prefill, per_token * 1e3)


def bench_int8(
    *,
    threads: int = 2,
    prefill_positions: int = 42,
    decode_tokens: int = 100,
    runs: int = 3,
    batches: Sequence[int] = (8, 16),
    agreement_steps: int = 200,
    cache_dir: Path | None = None,
    family: str = "cosyvoice2",
) -> Int8Report:
    torch.set_num_threads(threads)
    config = family_llm_config(full_llm_config(), family)
    prompt = _prompt(config, prefill_positions)
    fp32 = build_random_llm(config, dtype=torch.float32)
    with tempfile.TemporaryDirectory(prefix="cosyq-int8-") as scratch:
        start = time.perf_counter()
        ort_llm = load_ort_llm(
            fp32, cache_dir=cache_dir or Path(scratch), checkpoint_hash="random0", threads=threads
        )
        build_s = time.perf_counter() - start
        timings = [_timing("int8", ort_llm, prompt, decode_tokens, runs)]
        timings.append(_timing("fp32", fp32, prompt, decode_tokens, runs))
        bf16: Qwen2LM | None = build_random_llm(config, dtype=DTYPES["bf16"])
        timings.append(_timing("bf16", bf16, prompt, decode_tokens, runs))
        bf16 = None
        batched = {b: time_batched(ort_llm, b, runs) for b in batches}
        log.info("bench_llm_batched", ms_per_row=batched)
        ids = [torch.tensor(p, dtype=torch.long) for p in prompt]
        prefix = fp32.prefix_embeddings(*ids)
        agreement = compare_llm(fp32, ort_llm, prefix, steps=agreement_steps, seed=0)
        free = free_running(fp32, ort_llm, prefix, steps=agreement_steps, seed=0)
        agreement = dataclasses.replace(agreement, free=free)
        return Int8Report(
            timings=tuple(timings),
            weight_bytes=ort_llm.step_bytes(),
            bandwidth_gbs=memory_bandwidth_gbs(),
            batched_ms_per_row=batched,
            agreement=agreement,
            build_s=build_s,
        )
