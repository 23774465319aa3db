"""What CPU a bench ran on: its model name and the ISA flags that decide which precision pays.

The benches print it beside every table and `COSYQ_DTYPE=auto` reads it, since the best
precision and the gaps to the floor differ by CPU (AMX vs AVX512-BF16 vs AVX2 only). Read from
/proc/cpuinfo on Linux, `sysctl` on macOS; never imports torch (doctor uses it too).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

# The flags that matter for our kernels, in /proc/cpuinfo's spelling.
ISA_FLAGS = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_bf16",
    "amx_int8",
    "amx_tile",
)
CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class HostCPU:
    model: str
    machine: str  # platform.machine(): x86_64, arm64 ...
    flags: tuple[str, ...]  # the ISA_FLAGS this CPU has (arm64: what sysctl reports)
    cores: int

    @property
    def has_bf16_matmul(self) -> bool:
        """Native bf16 dot products: AMX or AVX512-BF16 on x86 (oneDNN's fast bf16 paths)."""
        return "amx_bf16" in self.flags or "avx512_bf16" in self.flags

    def line(self) -> str:
        return f"CPU: {self.model} ({self.machine}, {self.cores} cores); ISA: " + (
            " ".join(self.flags) or "none of " + " ".join(ISA_FLAGS)
        )

    def as_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "machine": self.machine,
            "flags": list(self.flags),
            "cores": self.cores,
        }


def parse_cpuinfo(text: str) -> tuple[str, set[str]]:
    """The first `model name` and the union of `flags` lines of a /proc/cpuinfo text."""
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key in ("flags", "Features"):
            flags.update(value.split())
    return model, flags


def _macos_cpu() -> tuple[str, set[str]]:
    def sysctl(name: str) -> str:
        done = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, check=False)
        return done.stdout.strip()

    flags = {"bf16"} if sysctl("hw.optional.arm.FEAT_BF16") == "1" else set()
    return sysctl("machdep.cpu.brand_string"), flags


def host_cpu() -> HostCPU:
    if sys.platform == "darwin":
        model, flags = _macos_cpu()
    elif CPUINFO.is_file():
        model, flags = parse_cpuinfo(CPUINFO.read_text(encoding="utf-8", errors="replace"))
    else:
        model, flags = "", set()
    known = tuple(f for f in (*ISA_FLAGS, "bf16") if f in flags)
    return HostCPU(
        model=model or platform.processor() or "unknown",
        machine=platform.machine(),
        flags=known,
        cores=os.cpu_count() or 1,
    )
