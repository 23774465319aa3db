"""Converting a memory-mapped checkpoint to a lower precision without keeping its pages resident.

A bf16 (or fp16) model should cost half the bytes of fp32, not fp32 plus half: converting the
mapped fp32 tensors makes their pages resident, and those file pages stay in the process's RSS
while the mapping lives (the whole file is one mapping, released only when the last tensor of
the checkpoint goes). So each tensor is converted in chunks, and after each chunk the source
pages it read are handed back to the kernel (`madvise(MADV_DONTNEED)`: on an unmodified file
mapping that only drops the process's page-table entries; the bytes stay in the file and the
page cache). Peak memory while loading is then the converted weights plus one chunk.

Releasing is only ever done on tensors that `torch.load(mmap=True)` returned (file-backed):
on anonymous memory `MADV_DONTNEED` would zero it.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections.abc import Callable, Collection, Mapping

import torch

CHUNK_ELEMENTS = 4 * 1024 * 1024  # 16 MB of fp32 read per step: the load's extra peak
_PAGE = mmap.PAGESIZE


def _libc_madvise() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_DONTNEED"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_MADVISE = _libc_madvise()


def release_mapped_range(start: int, end: int) -> None:
    """Drop this process's resident pages that lie wholly inside [start, end) (byte addresses
    of a file-backed mapping). A no-op where `madvise` is not available (not Linux)."""
    first = -(-start // _PAGE) * _PAGE
    last = end // _PAGE * _PAGE
    if _MADVISE is not None and last > first:
        _MADVISE(first, last - first, mmap.MADV_DONTNEED)


def convert_tensor(source: torch.Tensor, dtype: torch.dtype, *, mapped: bool) -> torch.Tensor:
    """`source.to(dtype)`, chunk by chunk; a `mapped` source's pages are released as read."""
    if not source.is_contiguous() or source.numel() == 0:
        out = source.to(dtype)
        if mapped and source.is_contiguous():
            release_mapped_range(source.data_ptr(), source.data_ptr() + source.nbytes)
        return out
    out = torch.empty(source.shape, dtype=dtype, device=source.device)
    flat_source, flat_out = source.view(-1), out.view(-1)
    base, itemsize = source.data_ptr(), source.element_size()
    released = base  # a page straddling two chunks is released with the second
    for begin in range(0, source.numel(), CHUNK_ELEMENTS):
        stop = min(begin + CHUNK_ELEMENTS, source.numel())
        flat_out[begin:stop].copy_(flat_source[begin:stop])
        if mapped:
            end = base + stop * itemsize
            release_mapped_range(released, end)
            released = max(base, end // _PAGE * _PAGE)
    return out


def convert_state_dict(
    state: Mapping[str, torch.Tensor],
    dtype: torch.dtype,
    *,
    mapped: bool,
    keep: Collection[str] = (),
) -> dict[str, torch.Tensor]:
    """Every floating-point tensor in `dtype` (as `module.to(dtype)` would convert them),
    one at a time; names in `keep` stay as they are (e.g. a tied copy that is never used)."""
    converted: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name in keep or not tensor.is_floating_point() or tensor.dtype == dtype:
            converted[name] = tensor
        else:
            converted[name] = convert_tensor(tensor, dtype, mapped=mapped)
    return converted
