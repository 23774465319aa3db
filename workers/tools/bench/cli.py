"""`cosyq-worker bench`: benchmarks that print tables.

`cosyq-worker bench [options]` benchmarks the synthesis engine (the default action). Further
benchmarks are subcommands registered below: each entry of `SUBCOMMANDS` names a module with
`register_bench(commands)` that adds its own parser (e.g. `bench queue`, `bench quantization`).
Registering stays cheap: nothing heavy is imported until a benchmark runs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any

from workers.tools.bench import DEFAULT_TEXT

# Modules exposing `register_bench(commands)`; e.g. "workers.tools.bench.queue_cli" (`bench queue`).
SUBCOMMANDS: tuple[str, ...] = (
    "workers.tools.bench.queue_cli",
    "workers.tools.bench.start_cli",
    "workers.tools.bench.soak_cli",
    "workers.tools.bench.quantization_cli",
    "workers.tools.bench.batch_cli",
    "workers.tools.bench.stream_cli",
    "workers.tools.bench.document_cli",
    "workers.tools.bench.cancel_cli",
    "workers.tools.bench.tenants_cli",
    "workers.tools.bench.stage_cli",  # llm, flow, hift
    "workers.tools.bench.vox_cli",  # vox side-by-side (issue 50)
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmarks (default: the synthesis engine, load to samples)",
        description="Without a subcommand: time the whole synthesis engine (load, first and "
        "repeated inference, RTF, RSS, per-stage times) and print a table.",
    )
    add_engine_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print every figure as JSON")
    parser.add_argument(
        "--no-floors",
        action="store_true",
        help="skip measuring the machine's bandwidth and GEMM rate and each stage's floor",
    )
    parser.set_defaults(handler=run_engine_bench)
    commands = parser.add_subparsers(dest="bench_command", metavar="SUBCOMMAND")
    for module_name in SUBCOMMANDS:
        importlib.import_module(module_name).register_bench(commands)


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=["torch"], default="torch")
    parser.add_argument("--device", default="cpu", help="cpu, mps, cuda or auto (default cpu)")
    parser.add_argument("--dtype", choices=["fp32", "fp16", "bf16"], default="fp32")
    parser.add_argument(
        "--config",
        choices=["tiny", "full-random"],
        default="tiny",
        help="tiny model, or the FULL architecture with random weights (default tiny)",
    )
    add_family_argument(parser)
    parser.add_argument("--model-dir", type=Path, help="bench this model directory instead")
    parser.add_argument("--runs", type=int, default=5, help="timed runs after the first")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--text", default=DEFAULT_TEXT)
    parser.add_argument(
        "--tokens", type=int, help="force this many speech tokens per piece (full-random: 100)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache-dir", type=Path, help="where full-random writes its model (~/.cache/cosyq/...)"
    )
    parser.add_argument(
        "--compare-fp32",
        action="store_true",
        help="with --dtype fp16/bf16 or --llm-precision int8: also load fp32 and print each "
        "stage's SNR against it (int8: and the sampled tokens' agreement over 200 steps)",
    )
    parser.add_argument(
        "--llm-precision",
        choices=["native", "int8"],
        default="native",
        help="int8: the LLM step in ONNX Runtime with 8-bit weights (COSYQ_LLM_PRECISION)",
    )
    parser.add_argument(
        "--omp-wait-policy",
        choices=["passive", "active", "inherit"],
        default="inherit",
        help="OpenMP threads sleep (passive: best when other work shares the cores) or spin "
        "(active) between parallel regions; inherit (default): as the environment has it",
    )


def add_family_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--family",
        choices=["cosyvoice2", "cosyvoice3"],
        default="cosyvoice2",
        help="the architecture --config writes: CosyVoice2-0.5B or Fun-CosyVoice3-0.5B "
        "(default cosyvoice2; full-random caches one model per family)",
    )


def set_omp_wait_policy(policy: str) -> str:
    """Set OMP_WAIT_POLICY before torch loads OpenMP; returns the policy in force.

    Once torch is loaded the runtime has read the variable: then it is left as it is, with a
    warning, and the printed table shows the policy that really applied.
    """
    wanted = policy.upper()
    current = os.environ.get("OMP_WAIT_POLICY")
    if policy == "inherit" or current == wanted:
        return current or "(unset)"
    if "torch" in sys.modules:
        print(
            f"cosyq-worker bench: torch was loaded before OMP_WAIT_POLICY={wanted} could be "
            f"set; the run keeps {current or '(unset)'}",
            file=sys.stderr,
        )
        return current or "(unset)"
    os.environ["OMP_WAIT_POLICY"] = wanted
    return wanted


def run_engine_bench(args: argparse.Namespace) -> int:
    if args.runs < 1:
        raise SystemExit("cosyq-worker bench: --runs must be at least 1")
    policy = set_omp_wait_policy(args.omp_wait_policy)
    from workers.tools.bench.engine_bench import BenchOptions, run_bench  # noqa: PLC0415 (after OMP)
    from workers.tools.bench.report import format_report  # noqa: PLC0415
    from workers.tools.bench.report_json import format_json  # noqa: PLC0415

    options = BenchOptions.from_args(
        args,
        runs=args.runs,
        compare_fp32=args.compare_fp32,
        omp_wait_policy=policy,
        floors=not args.no_floors,
    )
    result = run_bench(options)
    print(format_json(result) if args.json else format_report(result))
    return 0
