"""`python -m workers.tools.gpu_check`: run the plan's steps, write `gpu-check.json` (and the
steps' output in `gpu-check.log`) under `--out` after every step, so a run cut short still
leaves every figure it measured."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from workers.tools.gpu_check.plan import CheckOptions, Step, plan
from workers.tools.gpu_check.summary import StepResult, summarize

TAIL_CHARS = 3000
MIN_STEP_S = 20.0  # a step with less of the budget left is not started


def environment(device: str) -> dict[str, Any]:
    """Card, driver, torch and CUDA versions, the CPU and the load: what every figure needs."""
    import torch  # noqa: PLC0415

    env: dict[str, Any] = {
        "device": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpu": platform.processor() or platform.machine(),
        "load_average": list(os.getloadavg()),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["capability"] = list(torch.cuda.get_device_capability(0))
    if shutil.which("nvidia-smi"):
        query = ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv"]
        done = subprocess.run(query, check=False, capture_output=True, text=True, timeout=60)
        env["nvidia_smi"] = done.stdout.strip()
    return env


def run_step(step: Step, timeout_s: float, log: Path) -> StepResult:
    env = {**os.environ, **dict(step.env)}
    argv = step.argv
    if step.own_timeout:  # it ends itself first, writing what it has
        argv = (*argv, step.own_timeout, str(max(1, int(timeout_s - 15))))
    started = time.perf_counter()
    try:
        done = subprocess.run(
            argv,
            check=False,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=env,
            cwd=step.cwd,
        )
        rc: int | None = done.returncode
        out, err = done.stdout, done.stderr
    except subprocess.TimeoutExpired as e:
        rc = None
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout or ""
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr or ""
    seconds = time.perf_counter() - started
    with log.open("a") as file:
        command = " ".join(argv)
        file.write(f"==== {step.name} rc={rc} {seconds:.1f}s: {command}\n{out}\n{err}\n")
    data = None
    if step.json_output and rc == 0:
        lines = [line for line in out.strip().splitlines() if line.startswith("{")]
        data = json.loads(lines[-1]) if lines else None
    return StepResult(step.name, rc, seconds, data, (out + err)[-TAIL_CHARS:])


def read_upstream(options: CheckOptions) -> Any:
    path = options.work / "upstream.json"
    return json.loads(path.read_text()) if path.exists() else None


def run_check(options: CheckOptions, out: Path, budget_s: float) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    options.work.mkdir(parents=True, exist_ok=True)
    log = out / "gpu-check.log"
    env = environment(options.device)
    deadline = time.monotonic() + budget_s
    results: dict[str, StepResult] = {}
    summary: dict[str, Any] = {}
    for step in plan(options):
        left = deadline - time.monotonic()
        if left < MIN_STEP_S:
            results[step.name] = StepResult(step.name, None, 0.0, None, "not started: budget")
        else:
            results[step.name] = run_step(step, min(step.timeout_s, left), log)
        summary = summarize(results, env, read_upstream(options))
        (out / "gpu-check.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.tools.gpu_check")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny model, tiny counts (CPU)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-check-out")))
    parser.add_argument("--work", type=Path, default=Path("/tmp/cosyq-gpu-check"))
    parser.add_argument("--reference", type=Path, help="a reference set (flow.pt optional)")
    parser.add_argument("--upstream", type=Path, help="upstream's harness folder (.cvup)")
    parser.add_argument("--upstream-site", type=Path, help="where its carried wheels went")
    parser.add_argument("--checkout", type=Path, help="run the CUDA tests of this checkout")
    parser.add_argument("--dtypes", default="bf16,fp16", help="first: batch, stream and pool")
    parser.add_argument("--batch-sizes", default="1,8,32,64,128")
    parser.add_argument("--pool-workers", type=int, default=2)
    parser.add_argument("--pool-batch", type=int, default=64)
    parser.add_argument("--skip", default="", help="comma-separated step names")
    parser.add_argument("--budget-s", type=float, default=480.0, help="no step starts past it")
    args = parser.parse_args(argv)
    options = CheckOptions(
        device=args.device,
        quick=args.quick,
        work=args.work,
        reference=args.reference,
        upstream=args.upstream,
        upstream_site=args.upstream_site,
        dtypes=tuple(d for d in args.dtypes.split(",") if d),
        batch_sizes=tuple(int(b) for b in args.batch_sizes.split(",") if b),
        pool_workers=args.pool_workers,
        pool_batch=args.pool_batch,
        skip=frozenset(s for s in args.skip.split(",") if s),
        checkout=args.checkout,
    )
    summary = run_check(options, args.out, args.budget_s)
    failed = [name for name, step in summary["steps"].items() if step["rc"] != 0]
    print(json.dumps({k: summary[k] for k in ("device", "torch", "dtype", "targets")}, indent=1))
    print(f"steps failed or not run: {', '.join(failed) or 'none'}; {args.out}/gpu-check.json")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
