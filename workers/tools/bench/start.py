"""`cosyq-worker bench start`: how long a worker takes from process start to ready for jobs.

A pool restarts its workers (recycling, a crash, a deploy) and the test suite starts hundreds,
so this is the cost of every restart. Each sample starts `cosyq-worker run --burst` on an empty
queue of a private redis-server (never the operator's) with the given engine and model (default:
the tiny model, written to a temporary folder) and reads `worker_ready` back from its log: the
time from before the interpreter started to that line, and the model load and warm-up it names.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median

from workers.tools.bench.queue import recycle_cost, tiny_model_dir, worker_env
from workers.tools.local_redis import LocalRedis

TARGET_S = 0.8  # issue 46: a tiny-model worker ready within 0.8 s on a quiet AVX-512 host


@dataclass(frozen=True)
class StartStats:
    """Every sample, in seconds, in the order they ran."""

    engine: str
    start_to_ready_s: list[float]
    load_s: list[float]
    warm_up_s: list[float]
    imports_s: list[float]

    def summary(self) -> dict[str, float]:
        ready = self.start_to_ready_s
        return {
            "min_s": min(ready),
            "median_s": median(ready),
            "max_s": max(ready),
            "load_median_s": median(self.load_s),
            "warm_up_median_s": median(self.warm_up_s),
            "imports_median_s": median(self.imports_s),
            "target_s": TARGET_S,
        }

    def as_json(self) -> dict[str, object]:
        return {**asdict(self), **self.summary()}


def run(engine: str, model_dir: Path | None, repeats: int) -> StartStats:
    """Start an idle burst worker `repeats` times on a private redis-server."""
    with tempfile.TemporaryDirectory(prefix="cosyq-bench-start-") as temp:
        workdir = Path(temp)
        with LocalRedis(workdir / "redis") as server:
            if model_dir is None:
                model_dir = tiny_model_dir(workdir / "model")
            env = worker_env(server.url, engine, model_dir, workdir / "out", jobs=0)
            samples = recycle_cost(env, workdir, repeats)
    return StartStats(
        engine, samples.start_to_ready_s, samples.load_s, samples.warm_up_s, samples.imports_s
    )


def format_table(stats: StartStats) -> str:
    s = stats.summary()
    runs = ", ".join(f"{value:.2f}" for value in stats.start_to_ready_s)
    return "\n".join(
        [
            f"worker start benchmark: engine {stats.engine}, private redis-server, "
            f"{len(stats.start_to_ready_s)} starts",
            f"process start -> worker_ready: min {s['min_s']:.2f} s, median {s['median_s']:.2f} s,"
            f" max {s['max_s']:.2f} s (target <= {TARGET_S:.2f} s on a quiet host)",
            f"  of which model load {s['load_median_s']:.2f} s, warm-up "
            f"{s['warm_up_median_s']:.2f} s, first-use imports {s['imports_median_s']:.2f} s "
            f"(medians); every start: {runs}",
        ]
    )
