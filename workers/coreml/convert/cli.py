"""`cosyq-worker convert MODEL_DIR OUT_DIR`: the Core ML conversion command.

Registering is cheap (no torch or coremltools import); the work is imported when it runs.
`bench quantization` lives in `quantization_bench` (`register_bench`, `add_quantization_arguments`,
`run_quantization_bench`): add it to `workers.tools.bench.cli.SUBCOMMANDS`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path
from typing import Any

from shared.errors import ModelLoadError
from workers.coreml.convert.options import (
    COMPUTE_UNITS,
    DEFAULT_LLM_CAPACITY,
    PRECISIONS,
    TARGETS,
    WEIGHT_SCHEMES,
)
from workers.coreml.stages import DEFAULT_BATCH_SIZES

RUN_NEEDS_MACOS = (
    "Running these packages needs macOS (Core ML); on this machine workers use "
    "COSYQ_BACKEND=torch. Copy OUT_DIR to the Mac (or set COSYQ_COREML_DIR there)."
)


def parse_buckets(text: str) -> tuple[int, ...]:
    """ "256,512,1024" -> (256, 512, 1024); argparse reports a ValueError as a usage error."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from e


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert a model directory's flow and HiFT to Core ML packages",
        description=(
            "Convert the flow (encoder; CFM with the 10-step CFG Euler loop inside) and HiFT "
            "(source; decoder) to Core ML ML-program packages plus manifest.json; with "
            "--target macOS15 also the LLM (stateful KV cache, prefill + decode functions). "
            "CosyVoice 2 or 3, as the directory's yaml says (the manifest records which). "
            "Works on any OS; running the packages needs macOS."
        ),
    )
    parser.add_argument("model_dir", type=Path, metavar="MODEL_DIR")
    parser.add_argument("out_dir", type=Path, metavar="OUT_DIR")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp16")
    parser.add_argument("--weights", choices=WEIGHT_SCHEMES, default="none")
    parser.add_argument("--target", choices=TARGETS, default="macOS14")
    parser.add_argument(
        "--compute-units",
        choices=COMPUTE_UNITS,
        default="ALL",
        help="default for the runtime (COSYQ_COMPUTE_UNITS overrides it)",
    )
    parser.add_argument(
        "--flow-buckets",
        type=parse_buckets,
        default=(),
        metavar="FRAMES,...",
        help="enumerated CFM lengths in mel frames, e.g. 256,512,1024,2048 (Neural Engine); "
        "default: any length",
    )
    parser.add_argument(
        "--batch-sizes",
        type=parse_buckets,
        default=DEFAULT_BATCH_SIZES,
        metavar="ROWS,...",
        help="rows per call the flow and HiFT packages take (enumerated; a worker with "
        "COSYQ_BATCH_SIZE > 1 pads its rows up to the next one and splits above the largest); "
        f"1 for unbatched packages (default {','.join(map(str, DEFAULT_BATCH_SIZES))})",
    )
    parser.add_argument(
        "--flow-steps",
        type=int,
        default=None,
        metavar="STEPS",
        help="Euler steps unrolled into the CFM package (default: the model's 10); workers "
        "refuse a conversion whose steps differ from their engine's (tests and benchmarks)",
    )
    parser.add_argument(
        "--llm-capacity",
        type=int,
        default=DEFAULT_LLM_CAPACITY,
        metavar="POSITIONS",
        help="KV-cache positions of the Core ML LLM per request: prompt + speech tokens "
        f"(default {DEFAULT_LLM_CAPACITY})",
    )
    parser.add_argument(
        "--no-llm",
        dest="llm",
        action="store_false",
        help="leave the LLM on PyTorch even with --target macOS15",
    )
    parser.set_defaults(handler=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    options_module = importlib.import_module("workers.coreml.convert.options")
    try:
        options = options_module.ConvertOptions(
            precision=args.precision,
            weights=args.weights,
            target=args.target,
            compute_units=args.compute_units,
            flow_buckets=args.flow_buckets,
            batch_sizes=args.batch_sizes,
            flow_steps=args.flow_steps,
            llm=args.llm,
            llm_capacity=args.llm_capacity,
        )
    except ValueError as e:
        print(f"cosyq-worker convert: {e}", file=sys.stderr)
        return 2
    build = importlib.import_module("workers.coreml.convert.build")
    started = time.perf_counter()
    try:
        manifest = build.convert_model_dir(
            args.model_dir, args.out_dir, options, progress=_print_step
        )
    except (ModelLoadError, ValueError) as e:
        print(f"cosyq-worker convert: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.out_dir} in {time.perf_counter() - started:.0f} s:")
    print(_summary(manifest))
    if not options.converts_llm:
        why = "--no-llm" if not options.llm else "stateful KV-cache models need --target macOS15"
        print(f"LLM: not converted ({why}); workers run it on PyTorch (MPS on a Mac).")
    if sys.platform != "darwin":
        print(RUN_NEEDS_MACOS)
    return 0


def _print_step(step: str, seconds: float) -> None:
    print(f"  {step}: {seconds:.1f} s", flush=True)


def _summary(manifest: Any) -> str:
    rows = [("package", "MB", "precision", "weights", "lengths")]
    for entry in manifest.packages.values():
        if entry.buckets:
            lengths = "T in {" + ",".join(map(str, entry.buckets)) + "}"
        else:
            lengths = ", ".join(f"{s} {r.lower}..{r.upper}" for s, r in entry.dims.items())
        if entry.functions:
            lengths += f" ({' + '.join(entry.functions)}, states {len(entry.states)})"
        if entry.batch_sizes != (1,):
            lengths += ", B in {" + ",".join(map(str, entry.batch_sizes)) + "}"
        size = f"{entry.size_bytes / 1e6:.1f}"
        rows.append((entry.path, size, entry.precision, entry.compression, lengths))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    lines.append(f"  manifest.json: {manifest.family}, "
                 f"sources {', '.join(manifest.source_checkpoints)}, "
                 f"target {manifest.target}, compute units {manifest.compute_units}, "
                 f"flow steps {manifest.flow_steps}")  # fmt: skip
    return "\n".join(lines)
