"""`cosyq-worker bench quantization`: package size and output quality per weight format.

This module only declares the command (cheap to import); the experiment is in `quantization`.
Register it by adding "workers.tools.bench.quantization_cli" to
`workers.tools.bench.cli.SUBCOMMANDS`;
`python -m workers.tools.bench.quantization_cli` runs it with the same flags.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

VARIANTS = ("fp32", "fp16", "int8", "int8-block", "palette6", "palette4")
BENCH_TARGET = "macOS15"  # int8 per-block needs it; every row uses it
DEFAULT_TOKENS = 100  # 4 s of audio after ...
DEFAULT_PROMPT_TOKENS = 50  # ... a 2 s prompt: 300 mel frames through the CFM
DEFAULT_RUNS = 5  # Core ML timing runs (macOS)
DEFAULT_THREADS = 1  # torch intra-op threads (the shared 2-core machine stalls with two)


def register_bench(commands: Any) -> None:
    """`bench quantization` under the shared `bench` group."""
    parser = commands.add_parser(
        "quantization",
        help="Core ML weight formats: package size and output quality (SNR, mel distance)",
        description=(__doc__ or "").split("\n\n")[0],
    )
    add_quantization_arguments(parser)
    parser.set_defaults(handler=run_quantization_bench)


def add_quantization_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `cosyq-worker bench quantization`."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--model-dir", type=Path, help="a model directory (cosyvoice2.yaml, flow.pt, hift.pt)"
    )
    source.add_argument(
        "--reference", type=Path, help="a reference set (config.json + tiny checkpoints)"
    )
    parser.add_argument(
        "--size",
        choices=("tiny", "full"),
        default="tiny",
        help="with --reference: tiny checkpoints, or FULL architecture with random weights",
    )
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated subset of {','.join(VARIANTS)}",
    )
    parser.add_argument("--tokens", type=int, default=DEFAULT_TOKENS)
    parser.add_argument("--prompt-tokens", type=int, default=DEFAULT_PROMPT_TOKENS)
    parser.add_argument(
        "--runs", type=int, default=DEFAULT_RUNS, help="Core ML timing runs (macOS)"
    )
    parser.add_argument(
        "--threads", type=int, default=DEFAULT_THREADS, help="torch intra-op threads"
    )
    parser.add_argument("--seed", type=int, default=0)  # fmt: skip


def run_quantization_bench(args: argparse.Namespace) -> int:
    """Build the subject, measure every variant, print the table; exit status 0/2."""
    variants = tuple(v.strip() for v in args.variants.split(",") if v.strip())
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        print(f"--variants: unknown {unknown}; choose from {','.join(VARIANTS)}", file=sys.stderr)
        return 2
    import torch  # noqa: PLC0415 - the experiment's weight: only when the command runs

    from workers.tools.bench import quantization  # noqa: PLC0415

    torch.set_num_threads(args.threads)
    if args.model_dir is not None:
        subject = quantization.subject_from_model_dir(args.model_dir)
    else:
        subject = quantization.subject_from_reference(args.reference, args.size, seed=args.seed)
    params = sum(p.numel() for p in (*subject.flow.parameters(), *subject.hift.parameters()))
    print(f"Core ML quantization: {subject.name}, flow + HiFT {params / 1e6:.2f} M parameters, "
          f"{args.tokens} tokens + {args.prompt_tokens} prompt tokens, target {BENCH_TARGET}, "
          f"{args.threads} torch thread(s)")  # fmt: skip
    started = time.perf_counter()
    rows = quantization.run_variants(
        subject, variants, tokens=args.tokens, prompt_tokens=args.prompt_tokens,
        seed=args.seed, runs=args.runs, target=BENCH_TARGET,
        progress=lambda line: print(f"  {line}", flush=True),
    )  # fmt: skip
    print(quantization.format_table(rows))
    print(f"({time.perf_counter() - started:.0f} s; SNR and mel distances against the float32 "
          "PyTorch output on identical inputs; on Linux the packages' weights run in PyTorch, "
          "fp16 arithmetic is not modelled)")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m workers.tools.bench.quantization_cli` (same flags as `bench quantization`)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_quantization_arguments(parser)
    return run_quantization_bench(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
