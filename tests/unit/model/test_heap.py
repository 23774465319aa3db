"""Freed heap pages go back to the kernel on glibc (after a build), are kept for the next
request (the heap policy), and elsewhere both calls are no-ops."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import pytest

from shared.settings import Settings
from workers.model import heap
from workers.service.default_engine import engine_options

GLIBC = pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="the heap policy is glibc's: this host has no glibc"
)


@pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's: this host has no glibc"
)
def test_glibc_trim_is_found_and_runs() -> None:
    assert heap._malloc_trim() is not None
    heap.release_freed_heap()  # returns whether pages were released: either is correct


def test_no_glibc_means_no_trim_and_no_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    heap._glibc.cache_clear()
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    try:
        assert heap._malloc_trim() is None
        assert heap.release_freed_heap() is False
        assert heap.keep_freed_heap(heap.HeapPolicy()) == {}
        with heap.building_model(heap.HeapPolicy()) as applied:
            assert applied == {}
    finally:
        heap._glibc.cache_clear()


# Rounds of 96 touched 1 MB blocks, all freed after each round: the page faults of the later
# rounds. glibc's defaults hand the freed top back (each round faults its ~24,600 pages in
# again, as each streamed flow pass did); with the policy the pages stay mapped.
FAULT_ROUNDS = textwrap.dedent(
    """
    import json, resource, sys
    import numpy as np

    def rounds(count):
        faults = []
        for _ in range(count):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            blocks = [np.full(2**17, 1.0) for _ in range(96)]
            del blocks
            faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return faults
    """
)
ROUNDS = FAULT_ROUNDS + textwrap.dedent(
    """
    from workers.model.heap import HeapPolicy, keep_freed_heap
    applied = keep_freed_heap(HeapPolicy(*map(int, sys.argv[1:3])))
    print(json.dumps({"applied": applied, "faults": rounds(4)}))
    """
)


def _script(script: str, *args: int, env: dict[str, str] | None = None) -> dict:
    """Run `script` in a fresh interpreter (the heap policy is process-wide); its JSON line."""
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(done.stdout)


def _rounds(mmap_mb: int, trim_mb: int, env: dict[str, str] | None = None) -> dict:
    return _script(ROUNDS, mmap_mb, trim_mb, env=env)


@GLIBC
def test_the_policy_keeps_freed_blocks_mapped_for_the_next_request() -> None:
    kept = _rounds(32, 1024)
    assert kept["applied"] == {
        "MALLOC_MMAP_THRESHOLD_": 32 * 2**20,
        "MALLOC_TRIM_THRESHOLD_": 1024 * 2**20,
    }
    pages = 96 * 2**20 // 4096
    assert max(kept["faults"][1:]) < pages // 10, kept["faults"]


@GLIBC
def test_an_operators_malloc_variable_wins_and_zero_leaves_glibcs_default() -> None:
    env = {"MALLOC_TRIM_THRESHOLD_": "1048576", "PATH": "/usr/bin:/bin"}
    assert _rounds(32, 1024, env)["applied"] == {"MALLOC_MMAP_THRESHOLD_": 32 * 2**20}
    assert _rounds(0, 0)["applied"] == {}


# The same rounds while a model is being built, then after: inside, every freed block goes back
# to the kernel (each round faults its pages in again); after it, the request policy keeps them.
BUILD_THEN_ROUNDS = FAULT_ROUNDS + textwrap.dedent(
    """
    from workers.model.heap import HeapPolicy, building_model
    with building_model(HeapPolicy(32, 1024, int(sys.argv[1]))) as applied:
        inside = rounds(3)
    print(json.dumps({"applied": applied, "inside": inside, "after": rounds(3)}))
    """
)


def _build_rounds(build_kb: int, env: dict[str, str] | None = None) -> dict:
    return _script(BUILD_THEN_ROUNDS, build_kb, env=env)


@GLIBC
def test_a_build_hands_freed_blocks_back_then_requests_keep_them() -> None:
    pages = 96 * 2**20 // 4096
    built = _build_rounds(256)
    assert built["applied"] == {"MALLOC_MMAP_THRESHOLD_": 256 * 1024}
    assert min(built["inside"][1:]) > pages // 2, built  # freed blocks were unmapped
    assert max(built["after"][1:]) < pages // 10, built  # the request policy from then on


@GLIBC
def test_a_build_threshold_of_zero_or_an_operators_variable_leaves_the_build_alone() -> None:
    assert _build_rounds(0)["applied"] == {}
    env = {"MALLOC_MMAP_THRESHOLD_": "1048576", "PATH": "/usr/bin:/bin"}
    assert _build_rounds(256, env)["applied"] == {}


def test_heap_policy_bounds_and_settings() -> None:
    with pytest.raises(ValueError, match="0-32 MB"):
        heap.HeapPolicy(mmap_threshold_mb=33)
    with pytest.raises(ValueError, match=">= 0"):
        heap.HeapPolicy(trim_threshold_mb=-1)
    with pytest.raises(ValueError, match="0-32768 KB"):
        heap.HeapPolicy(build_mmap_threshold_kb=-1)
    settings = Settings(
        malloc_mmap_threshold_mb=8, malloc_trim_threshold_mb=256, malloc_build_mmap_threshold_kb=0
    )
    assert engine_options(settings).heap == heap.HeapPolicy(8, 256, 0)
    assert engine_options(Settings()).heap == heap.HeapPolicy()
