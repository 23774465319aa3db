"""Speed of the LLM stage at FULL size with random weights (no real checkpoint needed).

Measures what issue 4's "Bench" table asks for: prefill of a 42-position prompt and the
per-token decode time of batch-1 generation with stop ids masked (a forced token count), on a
chosen number of threads. Usage: `python -m workers.tools.bench.llm_stage [--threads 2] ...`.
Timings on a shared machine are noisy: take the best of a few runs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

from workers.model.cpu_linear import default_linear_kernel, linear_kernel, set_linear_kernel
from workers.model.llm import LLMConfig, Qwen2LM, iter_speech_tokens
from workers.model.llm_sampling import SamplingConfig
from workers.model.qwen2 import KVCache, Qwen2Config, RMSNorm
from workers.tools.reference.configs import llm_config_from_reference
from workers.tools.reference.parity import ReferenceSet

# CosyVoice2-0.5B's backbone (CosyVoice-BlankEN = Qwen2.5-0.5B shape; reference README).
FULL_QWEN2_CONFIG: Mapping[str, Any] = {
    "hidden_size": 896,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "intermediate_size": 4864,
    "vocab_size": 151936,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1e6,
    "max_position_embeddings": 32768,
    "hidden_act": "silu",
}
FULL_SPEECH_TOKENS = 6561
UPSTREAM_MS_PER_TOKEN = 122.7  # issue 4: upstream on this machine, fp32, 2 threads
UPSTREAM_PREFILL_S = 0.41
TARGET_MS_PER_TOKEN = 55.0
TARGET_PREFILL_S = 0.3
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def full_llm_config(reference: Path | None = None) -> LLMConfig:
    """The FULL LLM config: from a reference set's config.json if given, else the constants."""
    if reference is not None:
        return llm_config_from_reference(ReferenceSet(reference).config, "full")
    return LLMConfig(
        backbone=Qwen2Config.from_hf_config(FULL_QWEN2_CONFIG, source="FULL_QWEN2_CONFIG"),
        speech_token_size=FULL_SPEECH_TOKENS,
        sampling=SamplingConfig(),
    )


def build_random_llm(
    config: LLMConfig,
    *,
    dtype: torch.dtype = torch.float32,
    kernel: str | None = None,
    seed: int = 0,
) -> Qwen2LM:
    """Materialise on CPU with N(0, 0.02) weights (norm weights 1), eval mode, tied head."""
    with torch.device("meta"):
        model = Qwen2LM(config)
    model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            for name, param in module.named_parameters(recurse=False):
                if isinstance(module, RMSNorm):
                    param.fill_(1.0)
                elif name == "bias":
                    param.zero_()
                else:
                    param.normal_(0.0, 0.02, generator=generator)
    model.llm.model.tie_weights()
    model.to(dtype=dtype).eval().requires_grad_(False)
    set_linear_kernel(model, kernel or default_linear_kernel(torch.device("cpu"), dtype))
    return model


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
    return (
        torch.randint(vocab, (text_len,), generator=ids).tolist(),
        torch.randint(vocab, (prompt_text_len,), generator=ids).tolist(),
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prefill", type=int, default=42, help="prefix positions")
    parser.add_argument("--tokens", type=int, default=100, help="forced decode tokens")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    parser.add_argument("--kernel", choices=["torch", "onednn"], default=None)
    parser.add_argument("--reference", type=Path, default=None, help="config.json source")
    args = parser.parse_args(argv)
    result = bench_llm(
        config=full_llm_config(args.reference),
        threads=args.threads,
        prefill_positions=args.prefill,
        decode_tokens=args.tokens,
        runs=args.runs,
        dtype=args.dtype,
        kernel=args.kernel,
    )
    print(format_table(result))


if __name__ == "__main__":
    main()
