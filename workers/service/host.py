"""Host hygiene for one worker process: threads, Rosetta, accelerator cache, memory.

From the seed guide: K workers that each use every core make "concurrent inference gets slower",
so each worker gets cores ÷ pool size intra-op threads; a translated (Rosetta 2) Python measured
2-3× slower, so a worker refuses to run translated unless told to; MPS keeps freed blocks cached
until asked, so the cache is released after each job.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import psutil

from shared.errors import CosyqError

# Thread-count environment variables read by OpenMP / BLAS runtimes when they first load; set
# before torch is imported so even the first op respects the per-worker budget.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")
SYSCTL_TIMEOUT_S = 5.0


class UnsupportedHostError(CosyqError):
    """The host cannot run a worker as configured (e.g. a Rosetta-translated Python)."""


@dataclass(frozen=True)
class HostFacts:
    """What `worker_ready` reports about the machine."""

    platform: str  # sys.platform: "darwin", "linux"
    arch: str  # platform.machine(): "arm64", "x86_64"
    physical_cores: int
    translated: bool  # running under Rosetta 2


def physical_cores() -> int:
    """Physical cores (not hyper-threads); falls back to logical cores, then 1."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def threads_per_worker(configured: int | None, pool_size: int, cores: int) -> int:
    """The intra-op thread budget: the configured value, else cores ÷ pool size, at least 1."""
    if configured is not None:
        return max(1, configured)
    return max(1, cores // max(1, pool_size))


def limit_threads_before_load(threads: int, pool_size: int = 1) -> None:
    """Set the runtime thread variables (unless the operator set them) before torch loads.

    With several workers on one host, OpenMP threads that spin while waiting steal the cores
    the other workers compute on (measured here: RTF 3.6 passive vs 48 spinning when two
    processes share the cores), so a pool defaults to OMP_WAIT_POLICY=PASSIVE.
    """
    for name in THREAD_ENV_VARS:
        os.environ.setdefault(name, str(threads))
    if pool_size > 1:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def limit_threads_after_load(threads: int) -> None:
    """Apply the budget to torch when the engine imported it; no-op for engines without torch."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)


def read_proc_translated() -> str | None:
    """`sysctl -n sysctl.proc_translated`: "1" translated, "0" native, None when absent."""
    try:
        done = subprocess.run(
            ["sysctl", "-n", "sysctl.proc_translated"],
            capture_output=True,
            text=True,
            timeout=SYSCTL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def is_translated(
    system: str = sys.platform, read_sysctl: Callable[[], str | None] = read_proc_translated
) -> bool:
    """True when this process runs under Rosetta 2 (only possible on macOS)."""
    if system != "darwin":
        return False
    return read_sysctl() == "1"


def host_facts(translated: bool) -> HostFacts:
    return HostFacts(
        platform=sys.platform,
        arch=platform.machine(),
        physical_cores=physical_cores(),
        translated=translated,
    )


def refuse_translated(translated: bool, *, allow_rosetta: bool) -> None:
    """Stop a translated worker before it loads a model, unless the operator allowed it."""
    if translated and not allow_rosetta:
        raise UnsupportedHostError(
            "this Python runs under Rosetta 2 (x86_64 on Apple silicon), measured 2-3x slower: "
            "install an arm64 Python (e.g. python.org universal2 or `arch -arm64 brew install "
            "python`) and recreate the virtualenv, or set COSYQ_ALLOW_ROSETTA=true to run anyway"
        )


def release_accelerator_cache(device: str) -> None:
    """Return cached MPS blocks to the system after a job (CPU and CUDA need nothing here)."""
    torch = sys.modules.get("torch")
    if device == "mps" and torch is not None:
        torch.mps.empty_cache()


def rss_mb() -> float:
    """This process's resident set size in MiB."""
    return float(psutil.Process().memory_info().rss) / (1024 * 1024)
