"""The choices of one conversion (`cosyq-worker convert` flags), validated up front.

Pure Python so the CLI can build its parser without importing torch or coremltools.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.coreml.batch_sizes import check_batch_sizes
from workers.coreml.stages import DEFAULT_BATCH_SIZES, HIFT_SOURCE, MIN_FRAMES, UNBATCHED

PRECISIONS = ("fp16", "fp32")
TARGETS = ("macOS14", "macOS15")
COMPUTE_UNITS = ("ALL", "CPU_AND_NE", "CPU_AND_GPU", "CPU_ONLY")
WEIGHT_SCHEMES = ("none", "int8", "int8-block", "palette6", "palette4")
NEEDS_MACOS15 = frozenset({"int8-block"})  # per-block scales are an iOS 18 / macOS 15 op
FP32_ONLY_STAGES = frozenset({HIFT_SOURCE})  # phase up to ~4e3 rad: fp16 cannot hold it
DEFAULT_LLM_CAPACITY = 2048  # KV-cache positions per request: prompt + speech tokens (~60 s)
MIN_LLM_CAPACITY = 16
STATEFUL_TARGET = "macOS15"  # Core ML states (the LLM's KV cache) need iOS 18 / macOS 15


def check_scheme(scheme: str, target: str) -> None:
    """Raise ValueError for an unknown scheme or one the deployment target cannot run."""
    if scheme not in WEIGHT_SCHEMES:
        raise ValueError(f"--weights {scheme!r}: choose one of {', '.join(WEIGHT_SCHEMES)}")
    if scheme in NEEDS_MACOS15 and target != "macOS15":
        raise ValueError(f"--weights {scheme} needs --target macOS15 (per-block scales are iOS18+)")


@dataclass(frozen=True)
class ConvertOptions:
    """precision: compute precision inside the packages (I/O stays float32); weights: weight
    compression; target: minimum macOS; compute_units: the runtime's default; flow_buckets:
    enumerated CFM frame counts (empty: any length); batch_sizes: enumerated rows per call of
    the flow and HiFT packages ((1,): no batch axis, the packages of earlier conversions);
    flow_steps: Euler steps unrolled into the CFM package (None: the model's own 10; a worker
    refuses a conversion whose steps differ from its engine's); llm: also convert the LLM
    (only with target macOS15; always batch 1); llm_capacity: its KV-cache positions."""

    precision: str = "fp16"
    weights: str = "none"
    target: str = "macOS14"
    compute_units: str = "ALL"
    flow_buckets: tuple[int, ...] = ()
    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    flow_steps: int | None = None
    llm: bool = True
    llm_capacity: int = DEFAULT_LLM_CAPACITY

    def __post_init__(self) -> None:
        for value, allowed, flag in (
            (self.precision, PRECISIONS, "--precision"),
            (self.target, TARGETS, "--target"),
            (self.compute_units, COMPUTE_UNITS, "--compute-units"),
        ):
            if value not in allowed:
                raise ValueError(f"{flag} {value!r}: choose one of {', '.join(allowed)}")
        check_scheme(self.weights, self.target)
        buckets = self.flow_buckets
        if any(b < MIN_FRAMES for b in buckets) or list(buckets) != sorted(set(buckets)):
            raise ValueError(
                f"--flow-buckets {','.join(map(str, buckets))}: strictly increasing frame "
                f"counts >= {MIN_FRAMES}"
            )
        try:
            check_batch_sizes(self.batch_sizes)
        except ValueError as e:
            raise ValueError(f"--batch-sizes: {e}") from e
        if self.flow_steps is not None and self.flow_steps < 1:
            raise ValueError(f"--flow-steps {self.flow_steps}: at least 1")
        if self.llm_capacity < MIN_LLM_CAPACITY:
            raise ValueError(f"--llm-capacity {self.llm_capacity}: at least {MIN_LLM_CAPACITY}")

    @property
    def batched(self) -> bool:
        return self.batch_sizes != UNBATCHED

    @property
    def converts_llm(self) -> bool:
        return self.llm and self.target == STATEFUL_TARGET

    def stage_precision(self, stage: str) -> str:
        return "fp32" if stage in FP32_ONLY_STAGES else self.precision

    def stage_compression(self, stage: str) -> str:
        return "none" if stage in FP32_ONLY_STAGES else self.weights
