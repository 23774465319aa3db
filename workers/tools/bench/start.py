"""`cosyq-worker bench start`: how long a worker takes from process start to ready for jobs.

A pool restarts its workers (recycling, a crash, a deploy) and the test suite starts hundreds,
so this is the cost of every restart. Each sample starts `cosyq-worker run --burst` on an empty
queue of a private redis-server (never the operator's) with the given engine and model (default:
the tiny model, written to a temporary folder) and reads `worker_ready` back from its log: the
time from before the interpreter started to that line, and the model load and warm-up it names.

On Linux it then measures the pool's template mode (COSYQ_POOL_START=template): the template's
one-off start (its imports), and for each sample the time from the fork request, as the pool
makes it, to `worker_ready`.
"""

from __future__ import annotations

import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from statistics import median

from pydantic import TypeAdapter

from shared.settings import Settings
from workers.service.template import WorkerTemplate, preload_modules
from workers.tools.bench.queue import (
    BENCH_QUEUE,
    first_event,
    recycle_cost,
    tiny_model_dir,
    worker_env,
)
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
    template_start_s: float | None = None  # the template's one-off start (Linux only)
    fork_to_ready_s: list[float] = field(default_factory=list)
    template_load_s: list[float] = field(default_factory=list)
    template_warm_up_s: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, float]:
        ready = self.start_to_ready_s
        figures = {
            "min_s": min(ready),
            "median_s": median(ready),
            "max_s": max(ready),
            "load_median_s": median(self.load_s),
            "warm_up_median_s": median(self.warm_up_s),
            "imports_median_s": median(self.imports_s),
            "target_s": TARGET_S,
        }
        if self.fork_to_ready_s:
            figures.update(
                fork_min_s=min(self.fork_to_ready_s),
                fork_median_s=median(self.fork_to_ready_s),
                fork_max_s=max(self.fork_to_ready_s),
                fork_load_median_s=median(self.template_load_s),
                fork_warm_up_median_s=median(self.template_warm_up_s),
            )
        return figures

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
            stats = StartStats(
                engine,
                samples.start_to_ready_s,
                samples.load_s,
                samples.warm_up_s,
                samples.imports_s,
            )
            if sys.platform == "linux":
                stats = _template_samples(stats, env, workdir, repeats)
    return stats


def _template_samples(
    stats: StartStats, env: dict[str, str], workdir: Path, repeats: int
) -> StartStats:
    """The same idle burst worker, forked from a template as the pool forks it."""
    # read as the worker reads it (pydantic's bool), the model's default when it is not set
    field_info = Settings.model_fields["quality_import_at_start"]
    raw = env.get("COSYQ_QUALITY_IMPORT_AT_START", field_info.default)
    quality = TypeAdapter(bool).validate_python(raw)
    template = WorkerTemplate(preload_modules(stats.engine, quality_imports=quality), env)
    template_start_s = template.start()
    totals, loads, warms = [], [], []
    for attempt in range(repeats):
        log_path = workdir / f"template-{attempt}.log"
        started = time.time()
        worker = template.fork(["run", "--burst", BENCH_QUEUE], env, log_path=log_path)
        if worker.wait(timeout=600) != 0:
            raise RuntimeError(f"a forked worker failed, see {log_path}")
        ready = first_event(log_path, "worker_ready")
        totals.append(datetime.fromisoformat(str(ready["timestamp"])).timestamp() - started)
        loads.append(float(ready["load_s"]))
        warms.append(float(ready["warm_up_s"]))
    return replace(
        stats,
        template_start_s=template_start_s,
        fork_to_ready_s=totals,
        template_load_s=loads,
        template_warm_up_s=warms,
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
            *_template_lines(stats, s),
        ]
    )


def _template_lines(stats: StartStats, s: dict[str, float]) -> list[str]:
    if not stats.fork_to_ready_s or stats.template_start_s is None:
        return []
    runs = ", ".join(f"{value:.2f}" for value in stats.fork_to_ready_s)
    return [
        f"template mode (COSYQ_POOL_START=template): the template's one-off start "
        f"{stats.template_start_s:.2f} s, then",
        f"fork request -> worker_ready: min {s['fork_min_s']:.2f} s, median "
        f"{s['fork_median_s']:.2f} s, max {s['fork_max_s']:.2f} s (target <= {TARGET_S:.2f} s)",
        f"  of which model load {s['fork_load_median_s']:.2f} s, warm-up "
        f"{s['fork_warm_up_median_s']:.2f} s (medians); every start: {runs}",
    ]
