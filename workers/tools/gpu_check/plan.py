"""What the GPU check runs: each step one command line with its own time limit, in order.

Full run (`--device cuda`): full-size random weights, 100 forced tokens a piece, bf16 and fp16
against fp32, the issue's batch sizes, a pool of workers from a real Redis, recycle time, and
upstream's harness last (its own ~3 minutes). `--quick` (the CPU test): the tiny model, few
tokens, batch sizes 1 and 2, one worker; the same steps, so the plumbing is what is tested.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

WORKER = (sys.executable, "-m", "workers.cli")


@dataclass(frozen=True)
class CheckOptions:
    """One run's choices (from the command line)."""

    device: str = "cuda"
    quick: bool = False
    work: Path = Path("/tmp/cosyq-gpu-check")  # models, caches (never carried back)
    reference: Path | None = None  # a reference set (flow.pt may be left out)
    upstream: Path | None = None  # `.cvup` from make-upstream.sh (None: skip upstream)
    upstream_ckpt: Path | None = None  # where upstream's random checkpoints are written
    upstream_site: Path | None = None  # its carried wheels (transformers 4.51.3 ...), installed
    dtypes: tuple[str, ...] = ("bf16", "fp16")
    batch_sizes: tuple[int, ...] = (1, 8, 32, 64, 128)
    pool_workers: int = 2
    pool_batch: int = 64
    skip: frozenset[str] = field(default_factory=frozenset)
    checkout: Path | None = None  # the project's checkout: its CUDA tests run from there

    @property
    def tokens(self) -> int:
        return 8 if self.quick else 100

    @property
    def cache(self) -> Path:
        return self.work / "full-random"

    @property
    def model_dir(self) -> Path:
        """The model the pool and start steps load (the bench's own full-random one)."""
        return self.work / "tiny" if self.quick else self.cache / "model"


@dataclass(frozen=True)
class Step:
    name: str
    argv: tuple[str, ...]
    timeout_s: float
    json_output: bool = True  # stdout's last line is the step's JSON
    env: tuple[tuple[str, str], ...] = ()
    cwd: Path | None = None
    own_timeout: str | None = None  # its own flag for a deadline (given 15 s less than ours)


def _model_args(options: CheckOptions) -> tuple[str, ...]:
    if options.quick:
        return ("--config", "tiny", "--tokens", str(options.tokens))
    return ("--config", "full-random", "--cache-dir", str(options.cache), "--tokens", "100")


def bench_steps(options: CheckOptions) -> list[Step]:
    """Engine bench per dtype against fp32 (SNR per stage), batch, stream."""
    device = ("--device", options.device)
    runs = ("--runs", "1" if options.quick else "3")
    steps = []
    for dtype in options.dtypes:
        argv = (*WORKER, "bench", *device, "--dtype", dtype, "--compare-fp32", *runs)
        steps.append(Step(f"bench_{dtype}", (*argv, *_model_args(options), "--json"), 240))
    best = options.dtypes[0]
    sizes = ",".join(str(b) for b in ((1, 2) if options.quick else options.batch_sizes))
    argv = (*WORKER, "bench", "batch", *device, "--dtype", best, "--batch-sizes", sizes)
    steps.append(Step("batch", (*argv, *_model_args(options), "--json"), 240))
    jobs = "1" if options.quick else "3"
    stream = (*WORKER, "bench", "stream", *device, "--dtype", best, "--jobs", jobs, *runs)
    queue = ("--queue-jobs", "1", "--backlog-jobs", "0")
    steps.append(Step("stream", (*stream, *queue, *_model_args(options), "--json"), 240))
    return steps


def cosyvoice3_steps(options: CheckOptions) -> list[Step]:
    """CosyVoice 3 (the DiT flow, the causal HiFT) on the same card: the engine bench against
    fp32 (SNR per stage) and `bench batch`; last in the run, so they use what time is left."""
    family = ("--family", "cosyvoice3", "--device", options.device, "--dtype", options.dtypes[0])
    bench = (*WORKER, "bench", *family, "--compare-fp32", "--runs", "1")
    sizes = ",".join(str(b) for b in ((1, 2) if options.quick else options.batch_sizes[:4]))
    batch = (*WORKER, "bench", "batch", *family, "--batch-sizes", sizes)
    return [
        Step("cv3_bench", (*bench, *_model_args(options), "--json"), 240),
        Step("cv3_batch", (*batch, *_model_args(options), "--json"), 240),
    ]


def service_steps(options: CheckOptions) -> list[Step]:
    """A pool fed from Redis (and 8 streamed jobs at once), then recycled workers' starts."""
    best = options.dtypes[0]
    workers = 1 if options.quick else options.pool_workers
    batch = 2 if options.quick else options.pool_batch
    jobs = 3 if options.quick else workers * batch * 2
    streams = 2 if options.quick else 8
    pool = (sys.executable, "-m", "workers.tools.gpu_check.pool", "--model-dir")
    argv = (*pool, str(options.model_dir), "--device", options.device, "--dtype", best)
    sizes = ("--workers", str(workers), "--batch-size", str(batch), "--jobs", str(jobs))
    starts = "1" if options.quick else "2"
    counts = ("--streams", str(streams), "--tokens", str(options.tokens), "--starts", starts)
    engine = "workers.tools.gpu_check.pool:gpu_engine"
    env = (
        ("COSYQ_DEVICE", options.device),
        ("COSYQ_DTYPE", best),
        ("COSYQ_COMPILE_CACHE_DIR", str(options.work / "inductor")),
        ("BENCH_FORCED_TOKENS", str(options.tokens)),
    )
    start = (*WORKER, "bench", "start", "--repeats", "2", "--engine", engine)
    return [
        Step("pool", (*argv, *sizes, *counts, "--json"), 360, env=env[2:3]),
        Step("recycle", (*start, "--model-dir", str(options.model_dir), "--json"), 180, env=env),
    ]


CUDA_TESTS = ("tests/unit/model/test_cuda_decode.py", "tests/unit/model/test_llm_static_decode.py")


def test_step(options: CheckOptions) -> list[Step]:
    """The CUDA-only tests (graphs replay the eager step, the dynamic step's tokens), which
    skip everywhere else."""
    if options.checkout is None:
        return []
    argv = (sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:randomly", *CUDA_TESTS)
    return [Step("cuda_tests", argv, 120, json_output=False, cwd=options.checkout)]


def reference_step(options: CheckOptions) -> list[Step]:
    if options.reference is None:
        return []
    flow = (options.reference / "flow.pt").exists()
    stages = "llm,flow,stream,hift,features" if flow else "llm,hift,features"
    argv = (*WORKER, "model", "check-reference", str(options.reference), "--stages", stages)
    return [Step("check_reference", (*argv, "--device", options.device), 240, json_output=False)]


def upstream_steps(options: CheckOptions) -> list[Step]:
    """Upstream's harness (../shared/upstream-bench/README.md), in the same run."""
    if options.upstream is None:
        return []
    ckpt = str(options.upstream_ckpt or options.work / "cvckpt")
    harness = (sys.executable, "bench_upstream_gpu.py")
    out = str(options.work / "upstream.json")
    env = (("PYTHONPATH", str(options.upstream_site)),) if options.upstream_site else ()
    if options.quick:
        run: tuple[str, ...] = ("--device", "cpu", "--smoke", "--concurrency", "1")
    else:  # fp16 (upstream's own switch), 2 runs: what fits beside ours in one call
        run = ("--device", "cuda", "--dtype", "fp16", "--runs", "2", "--concurrency", "1,4")
    return [
        Step(
            "upstream_ckpt",
            (*harness, "--save-ckpt", "--ckpt", ckpt),
            150,
            json_output=False,
            env=env,
            cwd=options.upstream,
        ),
        Step(
            "upstream",
            (*harness, *run, "--stream", "--ckpt", ckpt, "--json", out),
            390,
            json_output=False,
            env=env,
            cwd=options.upstream,
            own_timeout="--timeout",
        ),
    ]


# What a cut-short run must have first: parity, the main dtype, the batch figure and upstream
# beside it (the ratio), then streaming, the pool, recycling, the second dtype.
ORDER = (
    "tiny_model",
    "check_reference",
    "cuda_tests",
    "bench_bf16",
    "batch",
    "upstream_ckpt",
    "upstream",
    "stream",
    "pool",
    "recycle",
    "bench_fp16",
    "cv3_bench",
    "cv3_batch",
)


def plan(options: CheckOptions) -> list[Step]:
    """Every step, in `ORDER` (steps it does not name last); a quick run first writes the tiny
    model its pool loads."""
    tiny = (*WORKER, "model", "init-tiny", str(options.model_dir))
    steps = [
        *([Step("tiny_model", tiny, 60, json_output=False)] if options.quick else []),
        *reference_step(options),
        *test_step(options),
        *bench_steps(options),
        *service_steps(options),
        *upstream_steps(options),
        *cosyvoice3_steps(options),
    ]
    rank = {name: index for index, name in enumerate(ORDER)}
    steps.sort(key=lambda step: rank.get(step.name, len(ORDER)))
    return [step for step in steps if step.name not in options.skip]
