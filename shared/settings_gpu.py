"""How a worker on a CUDA card decodes and compiles (`COSYQ_CUDA_*`, `COSYQ_COMPILE_*`), a block
of `Settings` fields kept apart so settings.py stays small. Ignored on the CPU and MPS, where
the kernel policy never takes the static decode path (README, "GPU workers").
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field


def _default_compile_cache_dir() -> Path:
    return Path.home() / ".cache" / "cosyq" / "inductor"


class GpuSettings(BaseModel):
    """CUDA graphs for the LLM's batched decode, torch.compile and its cache across restarts."""

    cuda_graphs: bool = Field(
        True,
        description="CUDA: the LLM's batched decode step runs as one captured CUDA graph per "
        "batch-size bucket, captured at start (false: the same static-cache step, launched "
        "kernel by kernel)",
    )
    compile_decode: bool = Field(
        False,
        description="CUDA: torch.compile the batched decode step before its graphs are "
        "captured (the first start compiles; later ones read COSYQ_COMPILE_CACHE_DIR)",
    )
    compile_cache_dir: Path = Field(
        default_factory=_default_compile_cache_dir,
        description="torch.compile's caches (Inductor's FX graph and autograd caches, Triton "
        "kernels), kept across recycled workers so a restart does not compile again",
    )
