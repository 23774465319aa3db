"""Freed heap pages go back to the kernel on glibc; elsewhere the call is a no-op."""

from __future__ import annotations

import platform

import pytest

from workers.model import heap


@pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc", reason="malloc_trim is glibc's: this host has no glibc"
)
def test_glibc_trim_is_found_and_runs() -> None:
    assert heap._malloc_trim() is not None
    heap.release_freed_heap()  # returns whether pages were released: either is correct


def test_no_glibc_means_no_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    heap._malloc_trim.cache_clear()
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    try:
        assert heap._malloc_trim() is None
        assert heap.release_freed_heap() is False
    finally:
        heap._malloc_trim.cache_clear()
