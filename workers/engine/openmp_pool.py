"""Give back the calling thread's idle OpenMP team before the model moves to another thread.

PyTorch's CPU build runs its parallel regions on OpenMP (libgomp on Linux). Each thread that
starts a parallel region gets a team of its own, and the team's workers stay parked after it.
Measured with the main thread's team parked: elementwise ops on a second thread took 2x as
long and a whole full-random request 16-34% longer; `GOMP_SPINCOUNT` did not remove that
(docs/benchmarks.md). The likely mechanism (inferred, not traced): with more OpenMP threads
than CPUs libgomp cuts its spin-wait short, so each parallel region pays a futex wake-up.
The model is loaded and warmed up on the main thread, then a batch session runs it on its
model thread: releasing the main thread's team at that hand-over (`omp_pause_resource_all`,
OpenMP 5.0) leaves one team in the process. A later parallel region on the releasing thread
builds a new team; nothing breaks. So that only the thread running the model holds one, a
batching worker's main thread also releases its team after each job it ran alone (a streamed
or add_voice job while no window is open), and an idle model thread releases its own before
it waits (a streamed job behind a backlog computed 2x slower in flow without that).
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from collections.abc import Callable
from functools import cache

import structlog

log = structlog.get_logger(__name__)

_OMP_PAUSE_SOFT = 1  # omp_pause_soft: threads go, nothing the program can observe changes
_RUNTIMES = ("libgomp*.so*", "libomp*.so*", "libiomp5*.so*", "libomp*.dylib", "libiomp5*.dylib")


@cache
def _pause_function() -> Callable[[int], int] | None:
    """The OpenMP runtime's `omp_pause_resource_all` that torch itself loaded, or None."""
    import torch  # noqa: PLC0415

    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    for pattern in _RUNTIMES:
        for path in sorted(glob.glob(os.path.join(lib_dir, pattern))):
            try:
                runtime = ctypes.CDLL(path)  # already mapped by torch: the same instance
                pause = runtime.omp_pause_resource_all
            except (OSError, AttributeError):
                continue
            pause.argtypes = [ctypes.c_int]
            pause.restype = ctypes.c_int
            return pause
    return None


def release_thread_team() -> bool:
    """Release the calling thread's idle OpenMP team; True when the runtime did.

    Call it on the thread that loaded the model, just before another thread takes the model
    over, and never from inside a parallel region (no torch op runs on this thread then)."""
    if "torch" not in sys.modules:
        return False  # no torch op has run: no team to give back
    pause = _pause_function()
    if pause is None:
        log.debug("openmp_team_kept", reason="no OpenMP runtime with omp_pause_resource_all")
        return False
    released = pause(_OMP_PAUSE_SOFT) == 0
    if not released:
        log.debug("openmp_team_kept", reason="omp_pause_resource_all refused")
    return released
