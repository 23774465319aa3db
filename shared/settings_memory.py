"""How a worker's process keeps freed memory (`COSYQ_MALLOC_*`), a block of `Settings` fields
kept apart so settings.py stays small; `Settings` inherits them and reads them like its own.

docs/benchmarks.md ("Heap retention, decode key buckets, chunk-mask key limits") has the
measurements behind the defaults.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class MemorySettings(BaseModel):
    """glibc's thresholds for handing freed blocks back (Linux; no effect elsewhere)."""

    malloc_mmap_threshold_mb: int = Field(
        32,
        ge=0,
        le=32,
        description="glibc (Linux): blocks up to this come from the heap, not a fresh mapping "
        "each (0: glibc's dynamic 128 KB-32 MB); a streamed flow pass otherwise page-faults in "
        "its keys/values again every time",
    )
    malloc_trim_threshold_mb: int = Field(
        1024,
        ge=0,
        description="glibc (Linux): freed heap top kept mapped for the next request up to this "
        "(0: glibc's default, twice the mmap threshold); recycling bounds what a worker keeps",
    )
    malloc_build_mmap_threshold_kb: int = Field(
        256,
        ge=0,
        le=32 * 1024,
        description="glibc (Linux): while the model is built, blocks over this are mapped one by "
        "one, so the plain weights conversion, fusion and packing free go back to the kernel "
        "instead of holding the build's peak above a request's (0: the policy above throughout)",
    )
