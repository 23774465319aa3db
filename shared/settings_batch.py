"""How a worker batches jobs (`COSYQ_BATCH_*`), a block of `Settings` fields kept apart so
settings.py stays small; `Settings` inherits them and reads them like its own.

docs/benchmarks.md ("Batching in the worker", "Cross-job batching") has what they buy.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class BatchSettings(BaseModel):
    """Cross-job batching: rows, windows, the flow's precision trade, the threads beside it."""

    batch_size: int = Field(
        1,
        ge=1,
        le=128,
        description="most jobs one worker runs together (1: one at a time; a CPU gains little "
        "past 16, a GPU's static decode takes up to 128); under Core ML the "
        "LLM then decodes batched on torch and the flow and HiFT calls take up to the "
        "conversion's largest --batch-sizes",
    )
    batch_wait_ms: float = Field(
        20.0, ge=0, le=5000, description="how long a batch's first job waits for company"
    )
    batch_flow: Literal["exact", "joined"] = Field(
        "exact",
        description="the flow of a batch's pieces below fp32: exact (each piece alone, so its "
        "audio is bit for bit its alone run) or joined (one padded call for all: less flow time, "
        "and a piece's mel differs from alone by about one bf16 rounding step); fp32 joins always",
    )
    batch_max_positions: int = Field(
        2048,
        ge=64,
        le=32768,
        description="LLM KV positions per batch row (prompt + text + speech); longer pieces "
        "run alone. Memory: 24 KiB per position per row on the full model (fp32)",
    )
    batch_alone_jobs: int = Field(
        4,
        ge=0,
        le=128,
        description="jobs too long for a batch row (they run one at a time beside the batch) "
        "that hold no row's place while they run or wait their turn, so other jobs fill the "
        "batch; past this many they hold one",
    )
    batch_poll_ms: float = Field(
        10.0, gt=0, le=1000, description="how often a batching worker looks for jobs to add"
    )
    batch_stream_peek_ms: float = Field(
        100.0,
        gt=0,
        le=5000,
        description="how often a full batch window looks for a streamed job at a queue's head "
        "(it runs ahead of the rows: its first chunk waits at most this much more)",
    )
    batch_io_threads: int = Field(
        2, ge=1, le=32, description="threads that validate, encode and store beside the model"
    )
