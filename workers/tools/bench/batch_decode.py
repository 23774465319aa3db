"""`cosyq-worker bench batch --decode-only`: the LLM's batched decode alone, per batch size.

Per batch size B, B requests (the bench text, seeds seed..seed+B-1) are planned by the engine
as the batch session plans them and their first pieces join a fresh row decoder (each row's
own prefill, timed apart); then the decoder steps until every row has made its forced
`tokens` speech tokens. The figure is the steps' wall time over B x tokens: **ms per token
per row**, sampling included (each row's RAS on its own generator), prefill excluded.

With `--llm-precision int8` each batch size is timed twice over, alternating: the int8 ONNX
Runtime rows (`OrtBatchDecoder`) and the native torch rows (`BatchDecoder`, the model's own
dtype: fp32 unless `--dtype` says otherwise) of the same weights, in one process and one run,
so their ratio compares like with like on a shared host. Native alone times the native rows.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile
import torch

from workers.engine.api import SynthesisInput
from workers.engine.cpu_features import HostCPU, host_cpu
from workers.engine.pipeline import SynthesisPipeline, build_engine
from workers.model.llm.batch import RowBatch
from workers.model.llm.decoder_choice import open_decoder, open_row_decoder
from workers.model.llm.model import Qwen2LM
from workers.tools.bench.engine_bench import BenchOptions, engine_options, model_directory

ROUNDS = 2  # alternating rounds per batch size and precision; the best is reported


@dataclass(frozen=True)
class DecodeFigures:
    precision: str  # "int8 (ORT)" or the native dtype
    batch_size: int
    tokens: int  # per row
    ms_per_row_token: float  # best of the rounds
    rounds_ms: tuple[float, ...]
    prefill_s: float  # mean per row, best round's


@dataclass(frozen=True)
class DecodeBench:
    model: str
    host: HostCPU
    threads: int
    positions: int  # each row's KV capacity (the engine's batch_max_positions)
    context: int  # positions prefilled per row
    rows: tuple[DecodeFigures, ...]
    load_average: tuple[float, float]
    omp_wait_policy: str


def _decoders(engine: SynthesisPipeline, batch: int) -> dict[str, Callable[[], RowBatch]]:
    """Each precision's fresh row decoder for `batch` rows: the engine's own, and native's
    beside an int8 engine (the torch model under its ORT step)."""
    llm = getattr(engine.llm, "model", None)
    positions = engine.options.batch_max_positions
    torch_model = llm if isinstance(llm, Qwen2LM) else getattr(llm, "model", None)
    if not isinstance(torch_model, Qwen2LM):
        raise SystemExit("bench batch --decode-only: the engine's LLM has no torch model")
    model: Qwen2LM = torch_model
    native = str(model.llm_decoder.weight.dtype).removeprefix("torch.")
    makers: dict[str, Callable[[], RowBatch]] = {}
    if llm is not model:
        makers["int8 (ORT)"] = lambda: _required(open_row_decoder(llm, batch, positions))
    makers[native] = lambda: open_decoder(model, batch, positions)
    return makers


def _required(decoder: RowBatch | None) -> RowBatch:
    if decoder is None:
        raise SystemExit("bench batch --decode-only: the engine's LLM has no batched decoder")
    return decoder


def time_rows(
    engine: SynthesisPipeline, decoder: RowBatch, requests: Sequence[SynthesisInput], tokens: int
) -> tuple[float, float, int]:
    """(ms per token per row, prefill s per row, positions prefilled) for one full decode."""
    plans = [engine.begin(request) for request in requests]
    start = time.perf_counter()
    for index, plan in enumerate(plans):
        decoder.add(
            index,
            plan.pieces[0].ids,
            prompt_text=plan.prompt.text_ids,
            prompt_speech=np.asarray(plan.prompt.speech_tokens, dtype=np.int64),
            generator=plan.state.generator,
            forced_length=tokens,
        )
    prefill = (time.perf_counter() - start) / len(plans)
    context = decoder.cache.lengths[0]
    start = time.perf_counter()
    made = 0
    while decoder.rows:
        made += sum(len(row.tokens) for row in decoder.step())
    wall = time.perf_counter() - start
    if made != tokens * len(plans):
        raise RuntimeError(f"expected {tokens * len(plans)} tokens, the rows made {made}")
    return 1000 * wall / made, prefill, context


def run(options: BenchOptions, batch_sizes: Sequence[int]) -> DecodeBench:
    torch.set_num_threads(options.threads)
    load_before = os.getloadavg()[0]
    tokens = options.tokens or 100
    with tempfile.TemporaryDirectory(prefix="cosyq-bench-decode-") as workdir:
        root = model_directory(options, Path(workdir))
        engine = build_engine(
            root,
            device=options.device,
            dtype=options.dtype,
            options=engine_options(options),
            hash_cache_dir=options.hash_cache_dir,
        )
        samples, rate = soundfile.read(root / "prompt.wav", dtype="float32")
        voice = engine.extract_voice(samples, int(rate), (root / "prompt.txt").read_text())
        rows: list[DecodeFigures] = []
        context = 0
        for batch in batch_sizes:
            requests = [
                SynthesisInput(text=options.text, prompt=voice, seed=options.seed + i)
                for i in range(batch)
            ]
            makers = _decoders(engine, batch)
            timed: dict[str, list[tuple[float, float]]] = {name: [] for name in makers}
            for _ in range(ROUNDS):
                for name, make in makers.items():
                    ms, prefill, context = time_rows(engine, make(), requests, tokens)
                    timed[name].append((ms, prefill))
            for name, figures in timed.items():
                best = min(figures)
                rows.append(
                    DecodeFigures(
                        precision=name,
                        batch_size=batch,
                        tokens=tokens,
                        ms_per_row_token=best[0],
                        rounds_ms=tuple(ms for ms, _ in figures),
                        prefill_s=best[1],
                    )
                )
    return DecodeBench(
        model=engine.identity.name,
        host=host_cpu(),
        threads=options.threads,
        positions=engine.options.batch_max_positions,
        context=context,
        rows=tuple(rows),
        load_average=(load_before, os.getloadavg()[0]),
        omp_wait_policy=options.omp_wait_policy,
    )


def format_table(result: DecodeBench) -> str:
    lines = [
        f"cosyq-worker bench batch --decode-only: {result.model}, {result.threads} threads, "
        f"OMP_WAIT_POLICY {result.omp_wait_policy}",
        result.host.line(),
        f"rows of {result.context} prefilled positions (KV capacity {result.positions}), "
        f"{result.rows[0].tokens if result.rows else 0} forced tokens each; best of {ROUNDS} "
        "alternating rounds",
        "| B | LLM | ms per token per row | rounds ms | prefill s per row | / native |",
        "|---|---|---|---|---|---|",
    ]
    for row in result.rows:
        same_b = [r for r in result.rows if r.batch_size == row.batch_size]
        native = same_b[-1].ms_per_row_token  # the native rows come last per batch size
        rounds = " / ".join(f"{ms:.2f}" for ms in row.rounds_ms)
        lines.append(
            f"| {row.batch_size} | {row.precision} | {row.ms_per_row_token:.2f} | {rounds} | "
            f"{row.prefill_s:.3f} | {row.ms_per_row_token / native:.2f}x |"
        )
    load = " -> ".join(f"{x:.2f}" for x in result.load_average)
    lines.append(f"load average (1 min) {load}; mean of all rounds: " + _means(result))
    return "\n".join(lines)


def _means(result: DecodeBench) -> str:
    return ", ".join(
        f"B={r.batch_size} {r.precision} {statistics.fmean(r.rounds_ms):.2f} ms"
        for r in result.rows
    )
