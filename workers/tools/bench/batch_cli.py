"""`cosyq-worker bench batch`: the engine's batch session, throughput per batch size."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from workers.tools.bench.cli import add_family_argument, set_omp_wait_policy

DEFAULT_BATCH_SIZES = "1,2,4,8,16"


def register_bench(commands: Any) -> None:
    batch = commands.add_parser(
        "batch",
        help="throughput, latency, stage times and RSS per batch size (continuous batching)",
        description="Submit B seeded requests at once to the engine's batch session for each "
        "batch size; print audio s, wall s, throughput, speed-up against B=1, p50/p95 job "
        "latency, seconds per stage per job and peak RSS, plus a plain engine.run beside them.",
    )
    batch.add_argument("--config", choices=["tiny", "full-random"], default="tiny")
    add_family_argument(batch)
    batch.add_argument("--model-dir", type=Path, help="bench this model directory instead")
    batch.add_argument(
        "--batch-sizes",
        default=DEFAULT_BATCH_SIZES,
        help=f"comma-separated (default {DEFAULT_BATCH_SIZES})",
    )
    batch.add_argument(
        "--tokens", type=int, help="force this many speech tokens per piece (full-random: 100)"
    )
    batch.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32")
    batch.add_argument("--device", default="cpu", help="cpu, mps, cuda or auto (default cpu)")
    batch.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    batch.add_argument("--seed", type=int, default=0)
    batch.add_argument("--cache-dir", type=Path, help="where full-random writes its model")
    batch.add_argument(
        "--omp-wait-policy",
        choices=["passive", "active", "inherit"],
        default="inherit",
        help="OpenMP waiting: passive (as a pool's workers run), active, or inherit (default: "
        "as the environment has it); the rows run on a model thread, the plain run on the "
        "main thread, and the policy changes how much that costs (docs/benchmarks.md)",
    )
    batch.add_argument(
        "--flow",
        choices=["exact", "joined"],
        default="exact",
        help="as COSYQ_BATCH_FLOW: exact (default; below fp32 each piece's flow runs alone, "
        "bit for bit its alone run) or joined (one flow call per batch in every precision)",
    )
    batch.add_argument(
        "--llm-precision",
        choices=["native", "int8"],
        default="native",
        help="int8: the LLM step in ONNX Runtime with 8-bit weights, batched rows too "
        "(COSYQ_LLM_PRECISION; its graph is cached in --cache-dir/onnx)",
    )
    batch.add_argument(
        "--decode-only",
        action="store_true",
        help="time the LLM's batched decode alone: ms per token per row for each batch size "
        "(with --llm-precision int8, the int8 rows beside the native ones in the same run)",
    )
    batch.add_argument("--json", action="store_true", help="print only the rows as JSON")
    batch.set_defaults(handler=run_batch_bench)


def parse_batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(
            f"cosyq-worker bench batch: --batch-sizes {text!r} is not a list of integers"
        ) from None
    if not sizes or min(sizes) < 1:
        raise SystemExit("cosyq-worker bench batch: --batch-sizes needs integers >= 1")
    return sizes


def run_batch_bench(args: argparse.Namespace) -> int:
    policy = set_omp_wait_policy(args.omp_wait_policy)
    from workers.tools.bench import batch  # noqa: PLC0415 (torch only when this bench runs)
    from workers.tools.bench.engine_bench import BenchOptions  # noqa: PLC0415

    sizes = parse_batch_sizes(args.batch_sizes)
    options = BenchOptions.from_args(args, omp_wait_policy=policy)
    if args.decode_only and (args.json or args.flow != "exact"):
        raise SystemExit(
            "cosyq-worker bench batch: --decode-only prints its table only and runs "
            "no flow (no --json, no --flow)"
        )
    if args.decode_only:
        from workers.tools.bench import batch_decode  # noqa: PLC0415

        print(batch_decode.format_table(batch_decode.run(options, sizes)))
        return 0
    result = batch.run(options, sizes, flow=args.flow)
    print(batch.format_json(result) if args.json else batch.format_table(result))
    return 0
