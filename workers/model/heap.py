"""Hand the heap's freed pages back to the kernel after a model is built (glibc only).

Converting, fusing and packing weights frees many multi-MB tensors in the middle of glibc's
heap; glibc keeps those pages (only the heap's top is trimmed on its own), so a bf16 LLM built
from random weights stayed at 1.43-1.73 GB of RSS where 1.36 GB was live (AMD EPYC probe).
`malloc_trim(0)` releases every whole free page (glibc >= 2.8 walks the whole heap).
Not after each request: trimming there made the next batched flow slower (bench batch bf16
B=16, 0.48-0.51 against 0.53-0.61 audio s per wall s, AMD EPYC Zen 4). One glibc arena for
every thread (`mallopt(M_ARENA_MAX, 1)`) took 30-50 MB off the bf16 B=1 peak but put the B=1
row at 0.94-1.02 of plain against 1.01-1.06: not used.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform


@functools.cache
def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


def release_freed_heap() -> bool:
    """Trim glibc's heap; False where there is no glibc (macOS, musl) or nothing to give back."""
    trim = _malloc_trim()
    return bool(trim(0)) if trim is not None else False
