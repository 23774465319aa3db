"""Hand the heap's freed pages back to the kernel after a model is built (glibc only).

Converting, fusing and packing weights frees many multi-MB tensors in the middle of glibc's
heap; glibc keeps those pages (only the heap's top is trimmed on its own), so a bf16 LLM built
from random weights stayed at 1.43-1.73 GB of RSS where 1.36 GB was live (AMD EPYC probe).
`malloc_trim(0)` releases every whole free page (glibc >= 2.8 walks the whole heap).
Not after each request: trimming there made the next batched flow slower (bench batch bf16
B=16, 0.48-0.51 against 0.53-0.61 audio s per wall s, AMD EPYC Zen 4). One glibc arena for
every thread (`mallopt(M_ARENA_MAX, 1)`) took 30-50 MB off the bf16 B=1 peak but put the B=1
row at 0.94-1.02 of plain against 1.01-1.06: not used.

`keep_freed_heap` (applied when an engine loads) stops glibc handing freed blocks back between
requests: by default every block over 128 KB-32 MB (its dynamic threshold) is mapped fresh and
unmapped on free, and the heap's top is trimmed above twice that, so each streamed flow pass
faulted in its keys/values buffers again: 210,000 page faults (~860 MB) in the first chunk's
flow pass of a voice's second request, 1.26-2.59 s per pass against 1.08-1.18 s with no faults
(full-random bf16, AMD EPYC Zen 5, 2 threads, six passes each). Blocks up to `mmap_threshold_mb`
then come from the heap, and up to `trim_threshold_mb` of freed top stays mapped for the next.

While a model is built (`building_model`) the policy is the opposite: every block over
`build_mmap_threshold_kb` is mapped on its own, so the plain weights that conversion, fusion
and packing free go straight back to the kernel. Kept in the heap, each freed weight left a
hole that the next, larger fused or packed one did not fit: a bf16 build of the full model
peaked at 1.67-1.81 GB (1.95-2.0 in some `cosyq-worker bench` processes) for 1.52 GB live,
above what a request adds later; mapped per block it peaks at 1.62-1.64 and the request's own
peak is the process's (1.68-1.70 against 1.68-1.77). Load 1.57-1.74 against 1.59-1.60 s
(56,000 more page faults: freed pages are faulted in afresh, not reused), requests as fast.
AMD EPYC Zen 4, 2 threads, alternating processes.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import platform
from collections.abc import Iterator
from dataclasses import dataclass

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX_MB = 32  # glibc refuses more on 64-bit (HEAP_MAX_SIZE / 2)
MMAP_VARIABLE = "MALLOC_MMAP_THRESHOLD_"


@dataclass(frozen=True)
class HeapPolicy:
    """How much freed memory glibc keeps for the next request (0: glibc's own default)."""

    mmap_threshold_mb: int = MMAP_THRESHOLD_MAX_MB  # blocks above are mapped per allocation
    trim_threshold_mb: int = 1024  # freed heap top kept mapped up to this
    build_mmap_threshold_kb: int = 256  # while a model is built (0: the policy above throughout)

    def __post_init__(self) -> None:
        if not 0 <= self.mmap_threshold_mb <= MMAP_THRESHOLD_MAX_MB:
            raise ValueError(f"heap: mmap threshold must be 0-{MMAP_THRESHOLD_MAX_MB} MB")
        if self.trim_threshold_mb < 0:
            raise ValueError("heap: trim threshold must be >= 0 MB")
        if not 0 <= self.build_mmap_threshold_kb <= MMAP_THRESHOLD_MAX_MB * 1024:
            raise ValueError(
                f"heap: build mmap threshold must be 0-{MMAP_THRESHOLD_MAX_MB * 1024} KB"
            )


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    libc = _glibc()
    return getattr(libc, "malloc_trim", None) if libc is not None else None


def keep_freed_heap(policy: HeapPolicy) -> dict[str, int]:
    """Set glibc's mmap and trim thresholds for this process; returns what was set, in bytes
    ({} without glibc). A threshold of 0, or one whose MALLOC_*_ variable the operator set
    (glibc read it at start), is left alone."""
    libc = _glibc()
    if libc is None:
        return {}
    applied = {}
    for name, parameter, mb in (
        (MMAP_VARIABLE, M_MMAP_THRESHOLD, policy.mmap_threshold_mb),
        ("MALLOC_TRIM_THRESHOLD_", M_TRIM_THRESHOLD, policy.trim_threshold_mb),
    ):
        if mb > 0 and name not in os.environ and libc.mallopt(parameter, mb * 2**20) == 1:
            applied[name] = mb * 2**20
    return applied


@contextlib.contextmanager
def building_model(policy: HeapPolicy) -> Iterator[dict[str, int]]:
    """Inside: blocks over `policy.build_mmap_threshold_kb` are mapped one by one (freed ones
    go straight back to the kernel); after: `keep_freed_heap(policy)`. Yields what was set for
    the build, in bytes ({}: nothing, as without glibc, with the operator's
    MALLOC_MMAP_THRESHOLD_, or with a threshold of 0 for the build or for requests: glibc's
    dynamic threshold cannot be given back once set)."""
    libc = _glibc()
    applied = {}
    if (
        libc is not None
        and policy.build_mmap_threshold_kb > 0
        and policy.mmap_threshold_mb > 0
        and MMAP_VARIABLE not in os.environ
        and libc.mallopt(M_MMAP_THRESHOLD, policy.build_mmap_threshold_kb * 1024) == 1
    ):
        applied[MMAP_VARIABLE] = policy.build_mmap_threshold_kb * 1024
    try:
        yield applied
    finally:
        keep_freed_heap(policy)


def release_freed_heap() -> bool:
    """Trim glibc's heap; False where there is no glibc (macOS, musl) or nothing to give back."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
