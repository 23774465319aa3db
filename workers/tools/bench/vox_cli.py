"""`cosyq-worker bench vox`: cosyq's LLM per speech token beside vox's q8 and bf16, in one run
(issue 50's side-by-side; what is timed: workers/tools/bench/vox_side.py)."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.tools.bench.vox_side import SideBySide, SideBySideOptions


def register_bench(commands: Any) -> None:
    parser = commands.add_parser(
        "vox",
        help="LLM ms per speech token: cosyq (native, int8) against vox q8 / bf16",
        description="Converts the model with vox's converter (once, cached), then times the "
        "LLM per speech token of vox q8 and bf16 and of cosyq's native precision and int8 "
        "on the same text, prompt, seed and threads, runs interleaved. Needs "
        "`pip install vox-tts==0.19.5`.",
    )
    parser.add_argument(
        "--model-dir", type=Path, help="official-layout CosyVoice 2 directory (default: tiny)"
    )
    parser.add_argument(
        "--config",
        choices=["tiny", "full-random"],
        default="tiny",
        help="without --model-dir: the tiny model (in a temporary folder) or the FULL random "
        "one (written once into --cache-dir)",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        help="vox's converted models (vox/), cosyq's int8 graphs (onnx/) and full-random's "
        "model (default ~/.cache/cosyq/full-random; tiny: its temporary folder)",
    )
    parser.add_argument(
        "--hash-cache-dir", type=Path, help="checkpoint hashes (default ~/.cache/cosyq/hashes)"
    )
    parser.add_argument("--text", help="what both engines say (default 'Hello there.')")
    parser.add_argument("--runs", type=int, default=3, help="timed rounds (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="threads of each engine")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vox-precisions", default="q8,bf16", help="default q8,bf16")
    parser.add_argument(
        "--omp-wait-policy",
        choices=["passive", "active", "inherit"],
        default="inherit",
        help="cosyq's OpenMP threads sleep (passive) or spin (active) between parallel "
        "regions; inherit (default): as the environment has it",
    )
    parser.add_argument("--json", action="store_true", help="print JSON (no table)")
    parser.set_defaults(handler=run_bench_vox)


def run_bench_vox(args: argparse.Namespace) -> int:
    from workers.tools.bench.cli import set_omp_wait_policy  # noqa: PLC0415 (cli imports us)
    from workers.tools.bench.vox_models import VoxMissingError, import_vox  # noqa: PLC0415

    try:
        import_vox()
    except VoxMissingError as e:
        print(e, file=sys.stderr)
        return 2
    import structlog  # noqa: PLC0415

    # the engines' log lines go to stderr: stdout holds only the table or the JSON
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    with tempfile.TemporaryDirectory(prefix="cosyq-bench-vox-") as workdir:
        policy = set_omp_wait_policy(args.omp_wait_policy)  # before torch is imported
        options = side_options(args, Path(workdir), policy)
        from workers.tools.bench.vox_side import run_side_by_side  # noqa: PLC0415

        result = run_side_by_side(options, on_run=lambda line: print(line, file=sys.stderr))
    print(json.dumps(as_json(result), indent=2) if args.json else format_table(result))
    return 0


def side_options(args: argparse.Namespace, workdir: Path, policy: str) -> SideBySideOptions:
    from workers.tools.bench.engine_bench import DEFAULT_CACHE, DEFAULT_HASH_CACHE  # noqa: PLC0415
    from workers.tools.bench.vox_models import VOX_PRECISIONS  # noqa: PLC0415
    from workers.tools.bench.vox_side import DEFAULT_TEXT, SideBySideOptions  # noqa: PLC0415

    precisions = tuple(p for p in args.vox_precisions.split(",") if p)
    unknown = set(precisions) - set(VOX_PRECISIONS)
    if unknown:
        raise SystemExit(f"cosyq-worker bench vox: --vox-precisions: unknown {sorted(unknown)}")
    cache_dir = args.cache_dir or DEFAULT_CACHE
    hash_cache_dir = args.hash_cache_dir or DEFAULT_HASH_CACHE
    if args.model_dir is not None:
        model_dir = args.model_dir
    elif args.config == "full-random":
        from workers.tools.fixtures.full_random import ensure_random_model  # noqa: PLC0415

        model_dir = ensure_random_model(cache_dir / "model", hash_cache_dir=hash_cache_dir)
    else:
        from workers.tools.fixtures.tiny import write_tiny_model  # noqa: PLC0415

        model_dir = write_tiny_model(workdir / "tiny").root
        cache_dir = args.cache_dir or workdir
    try:
        return SideBySideOptions(
            model_dir=model_dir,
            cache_dir=cache_dir,
            hash_cache_dir=hash_cache_dir,
            text=args.text or DEFAULT_TEXT,
            threads=args.threads,
            runs=args.runs,
            seed=args.seed,
            vox_precisions=precisions,
            omp_wait_policy=policy,
        )
    except ValueError as e:
        raise SystemExit(f"cosyq-worker bench vox: {e}") from e


def format_table(result: SideBySide) -> str:
    from workers.tools.bench.vox_side import MEASURE  # noqa: PLC0415

    o = result.options
    lines = [
        f"vox side-by-side: {o.model_dir} | vox {result.vox_version} | {o.threads} threads each"
        f" | cosyq's OMP_WAIT_POLICY {o.omp_wait_policy}",
        f"text {o.text!r} ({result.text_tokens} text tokens); seed {o.seed}; "
        f"{result.forced_tokens} speech tokens (vox q8's first run; cosyq forced to it)",
        f"measure: {MEASURE}",
        f"{'engine':<14}{'tokens':>12}{'best ms/tok':>13}{'median':>9}  runs (ms/token)",
    ]
    for t in result.timings:
        counts = sorted(set(t.tokens))
        tokens = "/".join(str(c) for c in counts)
        runs = ", ".join(f"{ms:.1f}" for ms in t.ms_per_token)
        lines.append(f"{t.label:<14}{tokens:>12}{t.best:>13.1f}{t.median:>9.1f}  {runs}")
    lines.append("ratio cosyq / vox (best; median), < 1: cosyq faster per token")
    for ours, theirs, best, median in result.ratios():
        lines.append(f"  {ours:<12} / {theirs:<9} {best:>6.2f}   ({median:.2f})")
    q8 = result.timing("vox q8").best
    fastest = min((t for t in result.timings if t.label.startswith("cosyq")), key=lambda t: t.best)
    verdict = "faster" if fastest.best < q8 else "not faster"
    lines.append(
        f"verdict: cosyq's fastest ({fastest.label}, {fastest.best:.1f} ms) is {verdict} per "
        f"token than vox q8 ({q8:.1f} ms) in this run"
    )
    lines.append(result.host.line())
    before, after = result.load_average
    lines.append(f"load average (1 min): {before:.2f} before the timed runs, {after:.2f} after")
    for model in result.conversions:
        how = f"converted in {model.converted_s:.0f} s" if model.converted_s else "cached"
        lines.append(f"vox {model.precision}: {model.path} ({how})")
    return "\n".join(lines)


def as_json(result: SideBySide) -> dict[str, Any]:
    from workers.tools.bench.vox_side import MEASURE  # noqa: PLC0415

    o = result.options
    return {
        "model_dir": str(o.model_dir),
        "vox_version": result.vox_version,
        "text": o.text,
        "text_tokens": result.text_tokens,
        "speech_tokens": result.forced_tokens,
        "threads": o.threads,
        "runs": o.runs,
        "seed": o.seed,
        "omp_wait_policy": o.omp_wait_policy,
        "measure": MEASURE,
        "cosyq_native_dtype": result.native_dtype,
        "engines": [
            {
                "engine": t.label,
                "tokens": list(t.tokens),
                "ms_per_token": list(t.ms_per_token),
                "best_ms_per_token": t.best,
                "median_ms_per_token": t.median,
            }
            for t in result.timings
        ],
        "ratios": [
            {"cosyq": ours, "vox": theirs, "best": best, "median": median}
            for ours, theirs, best, median in result.ratios()
        ],
        "host": result.host.as_json(),
        "load_average": {"before": result.load_average[0], "after": result.load_average[1]},
        "vox_models": [
            {"precision": m.precision, "path": str(m.path), "converted_s": m.converted_s}
            for m in result.conversions
        ],
    }
