"""`cosyq-worker bench llm|flow|hift`: one FULL-size stage with random weights, on its own.

The three share their arguments (`--threads`, `--runs`, `--dtype`, `--device`, `--reference`,
`--omp-wait-policy`) and print one table each; nothing heavy is imported until one runs.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from workers.tools.bench.cli import set_omp_wait_policy

DEFAULT_REFERENCE_DIR = Path("../shared/cosyvoice2-reference")


def register_bench(commands: Any) -> None:
    llm = _stage(
        commands,
        "llm",
        "prefill and per-token decode of the FULL LLM, stop ids masked",
        ("fp32", "fp16", "bf16"),
    )
    llm.add_argument("--prefill", type=int, default=42, help="prefix positions (default 42)")
    llm.add_argument("--tokens", type=int, default=100, help="forced decode tokens (default 100)")
    llm.add_argument("--kernel", choices=["torch", "onednn", "gemv"], default=None)
    llm.add_argument(
        "--llm-precision",
        choices=["native", "int8"],
        default="native",
        help="int8: the ONNX Runtime int8 step beside fp32 and bf16, its floor, batched steps "
        "and its accuracy against fp32 (one run)",
    )
    llm.add_argument("--batches", default="8,16", help="int8 batched decode sizes (default 8,16)")
    llm.add_argument(
        "--variants",
        action="store_true",
        help="with --llm-precision int8: instead, each quantization scheme's and session "
        "option's speed and accuracy against fp32, in one run (llm_int8_variants)",
    )
    llm.add_argument(
        "--only",
        default="",
        help="with --variants: comma-separated parts of the variant names to run (default all)",
    )
    llm.add_argument(
        "--steps", type=int, default=200, help="with --variants: agreement steps (default 200)"
    )
    llm.add_argument(
        "--family",
        choices=("cosyvoice2", "cosyvoice3"),
        default="cosyvoice2",
        help="cosyvoice3: its LLM (a 6,761-row head without bias, 200 stop ids; default "
        "cosyvoice2)",
    )
    llm.set_defaults(handler=run_llm, runs=3)
    flow = _stage(
        commands,
        "flow",
        "speaker projection, encoder and CFM solve of the FULL flow",
        ("fp32", "bf16"),
    )
    flow.add_argument("--tokens", type=int, default=100, help="generated tokens (default 100)")
    flow.add_argument("--prompt-tokens", type=int, default=50, help="prompt tokens (default 50)")
    flow.add_argument(
        "--family",
        choices=("cosyvoice2", "cosyvoice3"),
        default="cosyvoice2",
        help="cosyvoice3: the DiT flow, with its FLOPs floor (default cosyvoice2)",
    )
    flow.add_argument("--json", action="store_true", help="cosyvoice3: print JSON")
    flow.add_argument(
        "--flow-precision",
        choices=["native", "int8"],
        default="native",
        help="int8: fp32 and bf16, each also with its transformer products in int8 "
        "(workers.model.flow.int8_products), in interleaved rounds, mel SNR against fp32",
    )
    flow.epilog = (
        "--dtype bf16 (cosyvoice3): fp32, bf16 on plain PyTorch ops and bf16 with the CPU "
        "kernels in one run, each beside its floor, with the mel SNR against fp32"
    )
    flow.set_defaults(handler=run_flow, runs=3)
    hift = _stage(commands, "hift", "the FULL HiFT vocoder on a run of mel frames")
    hift.add_argument("--frames", type=int, default=200, help="mel frames (default 200)")
    hift.set_defaults(handler=run_hift, runs=5)


def _stage(
    commands: Any, name: str, what: str, dtypes: tuple[str, ...] = ("fp32",)
) -> argparse.ArgumentParser:
    """A stage's parser with the shared arguments (`cosyq-worker bench` times the other dtypes
    of the flow and HiFT, with their SNR against fp32)."""
    parser = commands.add_parser(name, help=f"{what} (random weights)", description=what)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    parser.add_argument("--runs", type=int, help="timed runs after the warm-up")
    parser.add_argument("--dtype", choices=dtypes, default="fp32")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument(
        "--reference",
        type=Path,
        default=None,
        help="read the FULL config from this reference set's config.json (hift: default "
        f"{DEFAULT_REFERENCE_DIR})",
    )
    parser.add_argument(
        "--omp-wait-policy", choices=["passive", "active", "inherit"], default="inherit"
    )
    return parser


def run_llm(args: argparse.Namespace) -> int:
    set_omp_wait_policy(args.omp_wait_policy)
    if args.llm_precision == "int8":
        return run_llm_int8(args)
    from workers.tools.bench.llm_stage import bench_llm, format_table  # noqa: PLC0415
    from workers.tools.fixtures.random_weights import (  # noqa: PLC0415
        family_llm_config,
        full_llm_config,
    )

    result = bench_llm(
        config=family_llm_config(full_llm_config(args.reference), args.family),
        threads=args.threads,
        prefill_positions=args.prefill,
        decode_tokens=args.tokens,
        runs=args.runs,
        dtype=args.dtype,
        kernel=args.kernel,
    )
    print(format_table(result))
    return 0


def run_llm_int8(args: argparse.Namespace) -> int:
    from workers.engine.cpu_features import host_cpu  # noqa: PLC0415

    if args.variants:
        return run_llm_int8_variants(args)
    from workers.tools.bench.llm_int8 import bench_int8  # noqa: PLC0415

    cpu = host_cpu()
    report = bench_int8(
        threads=args.threads,
        prefill_positions=args.prefill,
        decode_tokens=args.tokens,
        runs=args.runs,
        batches=[int(b) for b in args.batches.split(",") if b],
        family=args.family,
    )
    print(
        f"LLM FULL random weights ({args.family}), {args.threads} threads; "
        f"CPU {cpu.model} ({cpu.machine})"
    )
    print(f"ISA: {' '.join(cpu.flags)}; load average {os.getloadavg()[0]:.2f}")
    print("\n".join(report.lines()))
    return 0


def run_llm_int8_variants(args: argparse.Namespace) -> int:
    from workers.engine.cpu_features import host_cpu  # noqa: PLC0415
    from workers.tools.bench.llm_int8_variants import (  # noqa: PLC0415
        bench_variants,
        format_variants,
    )

    cpu = host_cpu()
    print(f"LLM FULL random weights, {args.threads} threads; CPU {cpu.model} ({cpu.machine})")
    print(f"ISA: {' '.join(cpu.flags)}; load average at start {os.getloadavg()[0]:.2f}")
    rows = bench_variants(
        threads=args.threads,
        prefill_positions=args.prefill,
        decode_tokens=args.tokens,
        runs=args.runs,
        steps=args.steps,
        only=tuple(part for part in args.only.split(",") if part),
    )
    print("\n".join(format_variants(rows)))
    return 0


def run_flow(args: argparse.Namespace) -> int:
    set_omp_wait_policy(args.omp_wait_policy)
    if args.family == "cosyvoice3":
        return _run_dit_flow(args)
    if args.dtype != "fp32":
        raise SystemExit("bench flow: --dtype bf16 is for --family cosyvoice3 (CosyVoice 2: "
                         "`cosyq-worker bench --dtype bf16` times its flow)")  # fmt: skip
    if args.flow_precision == "int8":
        from workers.engine.cpu_features import host_cpu  # noqa: PLC0415
        from workers.tools.bench.flow_int8 import (  # noqa: PLC0415
            compare_flow_precisions,
            format_rows,
        )

        rows = compare_flow_precisions(
            tokens=args.tokens,
            prompt_tokens=args.prompt_tokens,
            threads=args.threads,
            rounds=args.runs,
        )
        print(host_cpu().line())
        print("\n".join(format_rows(rows)))
        return 0
    from workers.tools.bench.flow_stage import format_flow_table, time_flow  # noqa: PLC0415
    from workers.tools.fixtures.random_weights import random_flow  # noqa: PLC0415

    flow = random_flow(device=args.device)
    timing = time_flow(
        flow,
        tokens=args.tokens,
        prompt_tokens=args.prompt_tokens,
        threads=args.threads,
        runs=args.runs,
    )
    print(format_flow_table(timing, device=args.device, dtype="fp32"))
    return 0


def _run_dit_flow(args: argparse.Namespace) -> int:
    import torch  # noqa: PLC0415

    from workers.tools.bench.dit_flow_stage import (  # noqa: PLC0415
        bench_dit_flow,
        dit_json,
        format_dit_table,
    )
    from workers.tools.fixtures.random_weights import random_dit_flow  # noqa: PLC0415
    from workers.tools.reference.configs import dit_flow_config_from_reference  # noqa: PLC0415
    from workers.tools.reference.parity import ReferenceSet  # noqa: PLC0415

    config = None
    if args.reference is not None:
        config = dit_flow_config_from_reference(ReferenceSet(args.reference).config, "full")
    result = bench_dit_flow(
        random_dit_flow(config),
        tokens=args.tokens,
        prompt_tokens=args.prompt_tokens,
        threads=args.threads,
        runs=args.runs,
        dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32,
    )
    print(dit_json(result) if args.json else format_dit_table(result))
    return 0


def run_hift(args: argparse.Namespace) -> int:
    set_omp_wait_policy(args.omp_wait_policy)
    from workers.tools.bench.hift_stage import bench_hift, format_table  # noqa: PLC0415
    from workers.tools.reference.configs import hift_config_from_reference  # noqa: PLC0415
    from workers.tools.reference.parity import ReferenceSet  # noqa: PLC0415

    reference = args.reference or DEFAULT_REFERENCE_DIR
    config = hift_config_from_reference(ReferenceSet(reference).config, "full")
    result = bench_hift(config, frames=args.frames, runs=args.runs, threads=args.threads)
    print(format_table(result))
    return 0
