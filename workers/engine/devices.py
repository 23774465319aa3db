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


def available_devices() -> set[str]:
    """The torch device types this machine and torch build can run on."""
    devices = {"cpu"}
    if mps_available():
        devices.add("mps")
    if cuda_available():
        devices.add("cuda")
    return devices


def resolve_device(name: str, available: set[str] | None = None) -> torch.device:
    """ "auto" | "cpu" | "mps" | "cuda" | "cuda:N" -> a torch.device that exists here.

    The one device resolver: backend selection passes the device types it probed (or a test's).
    """
    available = available_devices() if available is None else available
    if name == "auto":
        return torch.device(next(d for d in ("mps", "cuda", "cpu") if d in available))
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ModelLoadError(f"COSYQ_DEVICE={name}: not a torch device ({e})") from e
    if device.type not in ("cpu", "mps", "cuda"):
        raise ModelLoadError(f"COSYQ_DEVICE={name}: use auto, cpu, mps, cuda or cuda:N")
    if device.type not in available:
        raise ModelLoadError(
            f"COSYQ_DEVICE={name}: {device.type} is not available on this machine "
            f"(available: {', '.join(sorted(available))})"
        )
    return device


def resolve_dtype(name: str) -> torch.dtype:
    """ "fp32" | "fp16" | "bf16" -> torch dtype."""
    try:
        return DTYPES[name]
    except KeyError as e:
        raise ModelLoadError(f"COSYQ_DTYPE={name}: use one of {', '.join(DTYPES)}") from e
