"""The LLM runtime's settings (`COSYQ_LLM_PRECISION`, `COSYQ_ORT_CACHE_DIR`), a block of
`Settings` fields kept apart so settings.py stays small; `Settings` inherits them.

README, "Settings", and docs/benchmarks.md ("The LLM step in ONNX Runtime, int8") say when
int8 pays and what it costs in accuracy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field


def _default_ort_cache_dir() -> Path:
    return Path.home() / ".cache" / "cosyq" / "onnx"


class LLMSettings(BaseModel):
    """Which runtime decodes the LLM on CPU, and where its built graphs are kept."""

    llm_precision: Literal["auto", "native", "int8"] = Field(
        "auto",
        description="LLM on CPU: native (PyTorch at COSYQ_DTYPE), int8 (ONNX Runtime, 8-bit "
        "weights), or auto (int8 only on hosts measured to gain with the accuracy held)",
    )
    ort_cache_dir: Path = Field(
        default_factory=_default_ort_cache_dir,
        description="built int8 LLM graphs, one per checkpoint (a recycled worker reuses it)",
    )
    max_prompt_text_tokens: int = Field(
        512,
        ge=16,
        le=2048,
        description="longest instruction or zero_shot transcript in tokens: every piece repeats "
        "it to the LLM (a job's is refused before synthesis, a voice's when it is added)",
    )
