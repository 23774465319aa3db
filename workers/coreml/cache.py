"""Compile each Core ML package once per content hash, shared by every worker process.

Loading an `.mlpackage` compiles it on every load (an uncached Neural Engine compile has been
seen at ~2 minutes), which a recycling worker must not pay per process. Here a package is
compiled to `<cache>/compiled/<hash>/<name>.mlmodelc` under an exclusive file lock keyed by the
hash, so two workers starting together compile once: the second waits for the lock, then finds
the finished result. A compile is written to a temporary folder and renamed into place, and a
marker file written last says it is complete, so a crash mid-compile leaves nothing that a later
process would mistake for a compiled model.

Pure Python (fcntl locks, which macOS and Linux share); the compile function is passed in, so
the locking is tested on Linux with a stand-in compiler.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from shared.errors import ModelLoadError

COMPILE_LOCK_TIMEOUT_S = 900.0  # longest wait for another process's compile (ANE: ~2 min seen)
LOCK_POLL_S = 0.1
COMPLETE_MARKER = ".complete"
HASH_PREFIX = 32  # hex digits of the package hash used in folder names

CompileFn = Callable[[Path, Path], object]  # (package, destination .mlmodelc) -> anything


def compiled_model_path(
    package: Path,
    package_hash: str,
    cache_dir: Path,
    compile_fn: CompileFn,
    *,
    lock_timeout_s: float = COMPILE_LOCK_TIMEOUT_S,
) -> Path:
    """The compiled `.mlmodelc` of `package`, compiling it first if no process has yet."""
    key = package_hash[:HASH_PREFIX]
    folder = cache_dir / "compiled" / key
    compiled = folder / (package.stem + ".mlmodelc")
    if is_complete(folder):
        return compiled
    with exclusive_lock(cache_dir / "locks" / f"{key}.lock", lock_timeout_s):
        if is_complete(folder):  # compiled by the process we waited for
            return compiled
        staging = folder.with_name(f"{key}.tmp{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        try:
            compile_fn(package, staging / compiled.name)
            if not (staging / compiled.name).exists():
                raise ModelLoadError(f"{package}: compiling produced no {compiled.name}")
            (staging / COMPLETE_MARKER).write_text(package_hash + "\n")
            shutil.rmtree(folder, ignore_errors=True)  # an incomplete leftover, if any
            staging.rename(folder)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return compiled


def is_complete(folder: Path) -> bool:
    return (folder / COMPLETE_MARKER).is_file()


@contextlib.contextmanager
def exclusive_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """Hold an exclusive flock on `path`; ModelLoadError after `timeout_s` of waiting."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise ModelLoadError(
                        f"{path}: another process has been compiling this Core ML package for "
                        f"over {timeout_s:.0f} s (the lock is released when it exits)"
                    ) from e
                time.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
