"""Host rows: OS and architecture, Rosetta 2, macOS version, Python, threads, OMP_WAIT_POLICY,
precision, and the cache folders a worker writes.

Everything the seed guide warns about on a host, checked with the same functions a worker uses
at start-up (`workers.service.host`), so doctor and the worker cannot disagree.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Callable

from shared.errors import ModelLoadError
from shared.settings import Settings
from workers.service.cache_folders import setting_name, unwritable_setting, worker_folders
from workers.service.host import is_translated, physical_cores, threads_per_worker
from workers.tools.doctor.rows import Row, fail, ok, skip

GROUP = "host"
OS_ROW = "OS and architecture"
ROSETTA_ROW = "native or Rosetta 2"
MACOS_ROW = "macOS version"
PYTHON_ROW = "Python"
THREADS_ROW = "threads per worker"
OMP_ROW = "OMP_WAIT_POLICY"
PRECISION_ROW = "precision (COSYQ_DTYPE)"
CACHE_FOLDERS_ROW = "cache folders writable"
ROW_NAMES = (  # in report order
    OS_ROW,
    ROSETTA_ROW,
    MACOS_ROW,
    PYTHON_ROW,
    THREADS_ROW,
    OMP_ROW,
    PRECISION_ROW,
    CACHE_FOLDERS_ROW,
)
MIN_PYTHON = (3, 11)
MACOS_COREML = (14, 0)  # the conversion's lowest target: flow and HiFT on Core ML
MACOS_STATEFUL = (15, 0)  # stateful Core ML: the LLM's KV cache as a Core ML state
MACOS_COMPUTE_PLAN = (14, 4)  # MLComputePlan: where each op runs


def macos_version(
    mac_ver: Callable[[], tuple[str, object, str]] = platform.mac_ver,
) -> tuple[int, ...]:
    """(major, minor) of macOS, () elsewhere or when unknown."""
    text = mac_ver()[0]
    try:
        return tuple(int(part) for part in text.split(".")[:2]) if text else ()
    except ValueError:
        return ()


def host_rows(settings: Settings, *, system: str = sys.platform) -> list[Row]:
    return [
        os_row(),
        rosetta_row(settings, system=system),
        macos_row(settings, system=system),
        python_row(),
        threads_row(settings),
        omp_row(settings),
        precision_row(settings),
        cache_folders_row(settings, system=system),
    ]


def cache_folders_row(settings: Settings, *, system: str = sys.platform) -> Row:
    """The cache folders a worker with these settings writes (the probe `run` and `pool` make
    at start, workers/service/cache_folders.py), each made if missing and written once."""
    names = worker_folders(settings, platform=system)
    bad = {
        name: why for name in names if (why := unwritable_setting(name, getattr(settings, name)))
    }
    if bad:
        named = " and ".join(setting_name(name) for name in bad)
        hint = f"make the folder writable by the worker's user, or point {named} elsewhere"
        return fail(GROUP, CACHE_FOLDERS_ROW, "; ".join(bad.values()), hint)
    shown = ", ".join(f"{setting_name(name)}={getattr(settings, name)}" for name in names)
    return ok(GROUP, CACHE_FOLDERS_ROW, f"{shown}: written and removed a probe file")


def precision_row(settings: Settings) -> Row:
    """The CPU and its ISA flags, and the precision COSYQ_DTYPE means here (as the worker
    resolves and logs it at start: `auto` measures a quick bf16 check)."""
    from workers.engine.auto_dtype import resolve_dtype_setting  # noqa: PLC0415 (torch)
    from workers.engine.cpu_features import host_cpu  # noqa: PLC0415
    from workers.engine.devices import resolve_device  # noqa: PLC0415
    from workers.engine.llm_precision import choose_llm_precision  # noqa: PLC0415

    host = host_cpu()
    try:
        device = resolve_device(settings.device)
    except Exception as e:
        return skip(GROUP, PRECISION_ROW, f"device not resolved: {e}")
    choice = resolve_dtype_setting(settings.dtype, device)
    backend = "coreml" if settings.backend == "coreml" else "torch"
    try:
        llm = choose_llm_precision(
            settings.llm_precision, device=device, backend=backend, host=host
        )
    except ModelLoadError as e:
        return fail(GROUP, PRECISION_ROW, str(e), "set COSYQ_LLM_PRECISION=native or auto")
    return ok(
        GROUP,
        PRECISION_ROW,
        f"{choice.name} on {device.type}: {choice.reason}; LLM {llm.name}: {llm.reason}; "
        f"{host.line()}",
        dtype=choice.name,
        setting=settings.dtype,
        llm_precision=llm.name,
        flags=list(host.flags),
    )


def os_row() -> Row:
    name = f"{platform.system()} {platform.release()}, {platform.machine()}"
    return ok(GROUP, OS_ROW, name, system=sys.platform, arch=platform.machine())


def rosetta_row(
    settings: Settings, *, system: str = sys.platform, translated: bool | None = None
) -> Row:
    if system != "darwin":
        return ok(GROUP, ROSETTA_ROW, f"native {platform.machine()} (no Rosetta here)")
    translated = is_translated(system) if translated is None else translated
    if not translated:
        return ok(GROUP, ROSETTA_ROW, f"native {platform.machine()}")
    if settings.allow_rosetta:
        return ok(
            GROUP,
            ROSETTA_ROW,
            "translated (Rosetta 2), allowed by COSYQ_ALLOW_ROSETTA: measured 2-3x slower",
        )
    return fail(
        GROUP,
        ROSETTA_ROW,
        "this Python runs under Rosetta 2 (x86_64 on Apple silicon), measured 2-3x slower",
        "install an arm64 Python and recreate the virtualenv, or set COSYQ_ALLOW_ROSETTA=true",
    )


def macos_row(
    settings: Settings, *, system: str = sys.platform, version: tuple[int, ...] | None = None
) -> Row:
    name = MACOS_ROW
    if system != "darwin":
        return skip(GROUP, name, "not macOS: the torch backend runs here, Core ML does not")
    version = macos_version() if version is None else version
    shown = ".".join(str(v) for v in version) or "unknown"
    if version and version >= MACOS_STATEFUL:
        return ok(
            GROUP,
            name,
            f"macOS {shown}: Core ML flow and HiFT, and the stateful "
            "Core ML LLM (KV cache as state)",
        )
    if version and version >= MACOS_COREML:
        return ok(
            GROUP,
            name,
            f"macOS {shown}: Core ML flow and HiFT; the LLM stays on "
            "PyTorch (the stateful Core ML LLM needs macOS 15)",
        )
    return fail(
        GROUP,
        name,
        f"macOS {shown}: too old for our Core ML conversions (macOS 14 or later)",
        "upgrade to macOS 14+ (15 for the Core ML LLM), or set COSYQ_BACKEND=torch",
        required=settings.backend == "coreml",
    )


def python_row() -> Row:
    shown = platform.python_version()
    detail = f"{platform.python_implementation()} {shown} at {sys.executable}"
    if sys.version_info[:2] >= MIN_PYTHON:
        return ok(GROUP, PYTHON_ROW, detail)
    return fail(GROUP, PYTHON_ROW, detail, "cosyq needs Python 3.11 or later")


def threads_row(settings: Settings, *, cores: int | None = None) -> Row:
    cores = physical_cores() if cores is None else cores
    threads = threads_per_worker(settings.threads, settings.pool_size, cores)
    source = "COSYQ_THREADS" if settings.threads is not None else "cores ÷ pool size"
    used = threads * settings.pool_size
    detail = (
        f"{threads} threads per worker ({source}) × pool of {settings.pool_size} = {used} "
        f"of {cores} physical cores"
    )
    if used <= cores:
        return ok(
            GROUP,
            THREADS_ROW,
            detail,
            threads=threads,
            cores=cores,
            pool_size=settings.pool_size,
        )
    return fail(
        GROUP,
        THREADS_ROW,
        detail + ": oversubscribed, concurrent inference gets slower",
        f"unset COSYQ_THREADS or set it to {max(1, cores // settings.pool_size)} "
        "(cores ÷ COSYQ_POOL_SIZE)",
        required=False,
    )


def omp_row(settings: Settings) -> Row:
    value = os.environ.get("OMP_WAIT_POLICY")
    name = OMP_ROW
    if value is None:
        how = "the pool sets PASSIVE" if settings.pool_size > 1 else "one worker: no matter"
        return ok(GROUP, name, f"unset ({how})")
    if value.upper() == "ACTIVE" and settings.pool_size > 1:
        return fail(
            GROUP,
            name,
            f"ACTIVE with a pool of {settings.pool_size}: spinning threads steal the other "
            "workers' cores (measured RTF 3.6 passive vs 48 spinning)",
            "unset OMP_WAIT_POLICY or set it to PASSIVE",
            required=False,
        )
    return ok(GROUP, name, value)
