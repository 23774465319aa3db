"""Which torch device and dtype a worker runs on, from the `device` and `dtype` settings.

"auto" prefers Apple's GPU (MPS), then CUDA, then the CPU. Asking for a device this machine
does not have is a start-up error (ModelLoadError), not a silent fall back to the CPU.
"""

from __future__ import annotations

import torch

from shared.errors import ModelLoadError

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


def mps_available() -> bool:
    return bool(torch.backends.mps.is_available())


def cuda_available() -> bool:
    return bool(torch.cuda.is_available())


def resolve_device(name: str) -> torch.device:
    """ "auto" | "cpu" | "mps" | "cuda" (or "cuda:N") -> a torch.device that exists here."""
    if name == "auto":
        if mps_available():
            return torch.device("mps")
        if cuda_available():
            return torch.device("cuda")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ModelLoadError(f"COSYQ_DEVICE={name}: not a torch device ({e})") from e
    if device.type == "mps" and not mps_available():
        raise ModelLoadError("COSYQ_DEVICE=mps: this machine or torch build has no MPS device")
    if device.type == "cuda" and not cuda_available():
        raise ModelLoadError("COSYQ_DEVICE=cuda: no CUDA device is visible to torch")
    if device.type not in ("cpu", "mps", "cuda"):
        raise ModelLoadError(f"COSYQ_DEVICE={name}: use auto, cpu, mps or cuda")
    return device


def resolve_dtype(name: str) -> torch.dtype:
    """ "fp32" | "fp16" | "bf16" -> torch dtype."""
    try:
        return DTYPES[name]
    except KeyError as e:
        raise ModelLoadError(f"COSYQ_DTYPE={name}: use one of {', '.join(DTYPES)}") from e


def dtype_name(dtype: torch.dtype) -> str:
    return next(name for name, value in DTYPES.items() if value == dtype)
