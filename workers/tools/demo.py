"""`./scripts/demo`: the main job end to end on one machine, with nothing set up beforehand.

Starts a private Redis unless `COSYQ_REDIS_URL` is set, writes the tiny random-weight model
unless `COSYQ_MODEL_DIR` is set, starts a worker pool as its own processes, submits a handful of
requests through the producer CLI (`cosyq submit --wait`), and prints the CLI's summary plus a
table of the audio files written. Everything lands in one output folder.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from rich.console import Console
from rich.table import Table

from producer.cli import main as producer_main
from workers.tools.local_redis import LocalRedis
from workers.tools.pool_process import pool_process

PIPED_WIDTH = 160  # table width when stdout is not a terminal (logs, CI)
DEMO_REQUESTS: tuple[dict[str, Any], ...] = (
    {"text": "Hello! This is cosyq, turning text into speech through a Redis queue.",
     "output_key": "demo/01-zero-shot.wav", "seed": 1},
    {"text": "Each worker loads the model once, takes a few jobs, then exits for a fresh one.",
     "format": "flac", "output_key": "demo/02-flac.flac", "seed": 2},
    {"text": "Audio can go to a folder on disk or to any S3-compatible bucket.",
     "format": "ogg", "speed": 1.3, "output_key": "demo/03-faster.ogg", "seed": 3},
    {"text": "欢迎使用语音合成服务，祝你今天过得愉快。",
     "mode": "cross_lingual", "output_key": "demo/04-cross-lingual.wav", "seed": 4},
    {"text": "Thank you for waiting; your order is on its way.", "mode": "instruct2",
     "instruction": "Speak slowly and warmly.", "output_key": "demo/05-instruct.wav", "seed": 5},
    {"text": "Numbers like 42 and dates like 2026-11-29 are normalised first.",
     "sample_rate": 16000, "output_key": "demo/06-16khz.wav", "seed": 6},
    {"text": "Long texts are split at sentence boundaries. Each piece is synthesized on its own. "
             "The pieces are joined into one file. Nobody hears the seams.",
     "priority": "high", "output_key": "demo/07-long.wav", "seed": 7},
)  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scripts/demo", description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("demo-output"), help="output folder")
    parser.add_argument("-n", "--workers", type=int, default=2, help="worker pool size")
    parser.add_argument(
        "--family",
        choices=("cosyvoice2", "cosyvoice3"),
        default="cosyvoice2",
        help="the tiny model's family when COSYQ_MODEL_DIR is not set",
    )
    return parser


def _environment(
    stack: ExitStack, out: Path, workers: int, console: Console, family: str = "cosyvoice2"
) -> dict[str, str]:
    """COSYQ_* for the pool and the producer: the user's, or private defaults (the tiny model
    of `family`)."""
    env = dict(os.environ)
    state = out / ".state"
    if not env.get("COSYQ_REDIS_URL"):
        server = stack.enter_context(LocalRedis(state / "redis"))
        env["COSYQ_REDIS_URL"] = server.url
        console.print(f"started a private redis-server on port {server.port}")
    if not env.get("COSYQ_MODEL_DIR"):
        model_dir = _write_tiny(state, family)
        env["COSYQ_MODEL_DIR"] = str(model_dir.resolve())
        console.print(f"wrote the tiny random-weight model to {model_dir} (audio is noise-like)")
    env.setdefault("COSYQ_STORAGE_URL", out.resolve().as_uri())
    env.setdefault("COSYQ_POOL_SIZE", str(workers))
    return env


def _write_tiny(state: Path, family: str) -> Path:
    """The tiny random-weight model of `family` (torch is imported only here)."""
    if family == "cosyvoice3":
        from workers.tools.fixtures.tiny3 import write_tiny3_model  # noqa: PLC0415

        return write_tiny3_model(state / "tiny3-model").root
    from workers.tools.fixtures.tiny import write_tiny_model  # noqa: PLC0415

    return write_tiny_model(state / "tiny-model").root


def _where(uri: str) -> str:
    """A file:// URI as a path relative to the current folder when it is below it."""
    if not uri.startswith("file://"):
        return uri
    path = Path(unquote(urlsplit(uri).path))
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def _print_files(results_path: Path, console: Console) -> None:
    table = Table(title="audio written", expand=False)
    for column in ("line", "mode", "audio s", "rate", "RTF", "where"):
        table.add_column(
            column, justify="right" if column in ("line", "audio s", "RTF") else "left"
        )
    for record in map(json.loads, results_path.read_text(encoding="utf-8").splitlines()):
        if record["status"] != "ok":
            table.add_row(str(record["line"]), "-", "-", "-", "-", f"failed: {record['error']}")
            continue
        result, request = record["result"], DEMO_REQUESTS[record["line"] - 1]
        table.add_row(str(record["line"]), request.get("mode", "zero_shot"),
                      f"{result['duration_s']:.2f}", str(result["sample_rate"]),
                      f"{result['rtf']:.2f}", _where(result["uri"]))  # fmt: skip
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console(stderr=True)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    requests = out / "requests.jsonl"
    requests.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in DEMO_REQUESTS))
    with ExitStack() as stack:
        env = _environment(stack, out, args.workers, console, args.family)
        stack.enter_context(pool_process(env, args.workers, out / "worker.log"))
        console.print(f"started a pool of {args.workers} workers (log: {out / 'worker.log'})")
        os.environ.update(env)  # the producer CLI reads COSYQ_* like any producer would
        results = out / "results.jsonl"
        status = producer_main(["submit", str(requests), "--wait", "--results", str(results)])
    _print_files(results, Console(width=None if sys.stdout.isatty() else PIPED_WIDTH))
    console.print(f"requests: {requests}; results: {results}")
    return status


if __name__ == "__main__":
    sys.exit(main())
