"""What the CPU's matrix units are, as PyTorch itself sees them (no /proc parsing here: the
model layer asks the library whose kernels it is choosing between)."""

from __future__ import annotations

import functools

import torch


@functools.cache
def has_amx_tiles() -> bool:
    """True where PyTorch reports AMX tiles (Intel Xeon 4th gen and later): its flash attention
    and oneDNN's bf16 products then run on AMX, which changes which kernels are fastest. False
    on a torch without the probe."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return callable(probe) and bool(probe())
