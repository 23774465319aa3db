"""Speed of the LLM stage at FULL size with random weights (no real checkpoint needed).

Measures what the engine bench table shows: prefill of a 42-position prompt and the
per-token decode time of batch-1 generation with stop ids masked (a forced token count), on a
chosen number of threads. Usage: `cosyq-worker bench llm [--threads 2] ...`.
Timings on a shared machine are noisy: take the best of a few runs.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import psutil
import torch

from workers.model.cpu_linear import linear_kernel
from workers.model.llm.model import LLMConfig, Qwen2LM, iter_speech_tokens
from workers.model.llm.qwen2 import KVCache
from workers.tools.fixtures.random_weights import build_random_llm, full_llm_config

UPSTREAM_MS_PER_TOKEN = 122.7  # upstream on this kind of machine, fp32, 2 threads
UPSTREAM_PREFILL_S = 0.41
TARGET_MS_PER_TOKEN = 55.0
TARGET_PREFILL_S = 0.3
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class LLMBenchResult:
    threads: int
    dtype: str
    kernel: str
    build_s: float
    rss_gb: float
    prefill_positions: int
    prefill_s: float  # best of runs
    decode_tokens: int
    ms_per_token: float  # best run's mean
    ms_per_token_runs: tuple[float, ...]


def _prompt(config: LLMConfig, prefill_positions: int) -> tuple[list[int], list[int], list[int]]:
    """Text / prompt text / prompt speech ids making a prefix of `prefill_positions`."""
    rest = prefill_positions - 2  # SOS and TASK_ID
    text_len = max(1, rest // 4)
    prompt_text_len = rest // 4
    speech_len = rest - text_len - prompt_text_len
    ids = torch.Generator().manual_seed(1)
    vocab, speech = config.backbone.vocab_size, config.speech_token_size
    prompt_text = torch.randint(vocab, (prompt_text_len,), generator=ids).tolist()
    if config.required_text_token is not None and prompt_text:  # CosyVoice 3: <|endofprompt|>
        prompt_text[-1] = config.required_text_token
    return (
        torch.randint(vocab, (text_len,), generator=ids).tolist(),
        prompt_text,
        torch.randint(speech, (speech_len,), generator=ids).tolist(),
    )


@torch.inference_mode()
def time_prefill(model: Qwen2LM, prompt: tuple[list[int], list[int], list[int]]) -> float:
    start = time.perf_counter()
    ids = [torch.tensor(p, dtype=torch.long) for p in prompt]
    prefix = model.prefix_embeddings(*ids)
    cache = KVCache(model.config.backbone, prefix.shape[1] + 1, dtype=prefix.dtype)
    model.step_logp(prefix, cache)
    return time.perf_counter() - start


def time_decode(model: Qwen2LM, prompt: tuple[list[int], list[int], list[int]], n: int) -> float:
    """Mean seconds per token after the first (the first one includes the prefill)."""
    text, prompt_text, prompt_speech = prompt
    tokens = iter_speech_tokens(
        model,
        text,
        prompt_text=prompt_text,
        prompt_speech=prompt_speech,
        generator=torch.Generator().manual_seed(0),
        forced_length=n,
    )
    next(tokens)
    start = time.perf_counter()
    count = sum(1 for _ in tokens)
    return (time.perf_counter() - start) / max(count, 1)


def bench_llm(
    *,
    config: LLMConfig | None = None,
    threads: int = 2,
    prefill_positions: int = 42,
    decode_tokens: int = 100,
    runs: int = 3,
    dtype: str = "fp32",
    kernel: str | None = None,
) -> LLMBenchResult:
    """Build FULL random weights, then time prefill and decode `runs` times each."""
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return _bench(
            config or full_llm_config(),
            threads=threads,
            prefill_positions=prefill_positions,
            decode_tokens=decode_tokens,
            runs=runs,
            dtype=dtype,
            kernel=kernel,
        )
    finally:
        torch.set_num_threads(previous_threads)


def _bench(
    config: LLMConfig,
    *,
    threads: int,
    prefill_positions: int,
    decode_tokens: int,
    runs: int,
    dtype: str,
    kernel: str | None,
) -> LLMBenchResult:
    start = time.perf_counter()
    model = build_random_llm(config, dtype=DTYPES[dtype], kernel=kernel)
    build_s = time.perf_counter() - start
    prompt = _prompt(config, prefill_positions)
    time_prefill(model, prompt)  # warm-up: kernel selection, page faults
    prefill = min(time_prefill(model, prompt) for _ in range(runs))
    per_token = tuple(time_decode(model, prompt, decode_tokens) * 1e3 for _ in range(runs))
    chosen = linear_kernel(model)
    return LLMBenchResult(
        threads=threads,
        dtype=dtype,
        kernel=chosen,
        build_s=build_s,
        rss_gb=psutil.Process().memory_info().rss / 1e9,
        prefill_positions=prefill_positions,
        prefill_s=prefill,
        decode_tokens=decode_tokens,
        ms_per_token=min(per_token),
        ms_per_token_runs=per_token,
    )


def format_table(result: LLMBenchResult) -> str:
    r = result
    runs = ", ".join(f"{v:.1f}" for v in r.ms_per_token_runs)
    rows = [
        f"LLM FULL random weights, {r.dtype}, {r.threads} threads, linear kernel {r.kernel}",
        f"{'measure':<34}{'upstream':>10}{'target':>10}{'ours':>10}",
        f"{'per token, batch 1 (ms)':<34}{UPSTREAM_MS_PER_TOKEN:>10.1f}"
        f"{TARGET_MS_PER_TOKEN:>10.1f}{r.ms_per_token:>10.1f}",
        f"{f'prefill, {r.prefill_positions} positions (s)':<34}{UPSTREAM_PREFILL_S:>10.2f}"
        f"{TARGET_PREFILL_S:>10.2f}{r.prefill_s:>10.3f}",
        f"decode runs ({r.decode_tokens} tokens each, ms/token): {runs}; "
        f"median {statistics.median(r.ms_per_token_runs):.1f}",
        f"build {r.build_s:.1f} s, RSS {r.rss_gb:.2f} GB",
    ]
    return "\n".join(rows)
