"""`COSYQ_LLM_PRECISION`: which runtime decodes the LLM, and the reason for it.

- `native`: PyTorch at the worker's dtype (fp32 or bf16), as before this setting existed.
- `int8`: the step graph in ONNX Runtime with 8-bit weights (`workers.model.llm.ort_decoder`);
  CPU and the torch backend only (a GPU or Core ML LLM has its own half precision).
- `auto`: int8 only on a host class where a measurement showed it meets the issue's bars
  (decode <= 0.6x bf16's ms/token on AVX512 hosts, <= 0.7x fp32's on AVX2 hosts, log-probs
  >= 40 dB and >= 95% of sampled tokens the same as fp32's). `MEASURED` lists each host class
  measured and its verdict; a class not listed stays native (no measurement, no int8).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from shared.errors import ModelLoadError
from workers.engine.cpu_features import HostCPU, host_cpu
from workers.engine.stages import ModuleSpeechTokens
from workers.model.loader import LoadedModel

# Host class -> (int8 pays and holds, what was measured: docs/benchmarks.md's int8 section).
MEASURED: dict[str, tuple[bool, str]] = {
    "avx512_bf16": (
        False,
        "int8 measured on a 2-core AMD EPYC Zen 4 (AVX512-BF16, no AMX): decode 0.45x bf16's "
        "ms/token but 1.84x its floor, and the same sampled token on only 33% of 200 "
        "teacher-forced steps (bar: 95%); stays native (docs/benchmarks.md, int8 section)",
    ),
}


@dataclass(frozen=True)
class LLMPrecisionChoice:
    name: str  # "native" | "int8"
    reason: str


def host_class(host: HostCPU) -> str:
    """The ISA class the int8 measurements are kept by: amx, avx512_bf16, avx2 or other."""
    flags = set(host.flags)
    if "amx_bf16" in flags or "amx_tile" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    if "avx2" in flags:
        return "avx2"
    return "other"


def choose_llm_precision(
    setting: str,
    *,
    device: torch.device,
    backend: str = "torch",
    host: HostCPU | None = None,
    family: str = "cosyvoice2",
) -> LLMPrecisionChoice:
    """A `COSYQ_LLM_PRECISION` value -> the LLM runtime (`host` injectable for tests).

    An explicit int8 where it cannot run is a configuration error (ModelLoadError); the int8
    step is CosyVoice 2's only so far, so `auto` keeps CosyVoice 3 native."""
    runs_int8 = device.type == "cpu" and backend == "torch"
    if setting == "native":
        return LLMPrecisionChoice("native", "COSYQ_LLM_PRECISION=native (set explicitly)")
    if family != "cosyvoice2":
        if setting == "int8":
            raise ModelLoadError(
                "COSYQ_LLM_PRECISION=int8 serves CosyVoice 2 only so far (this model directory "
                "is CosyVoice 3): set COSYQ_LLM_PRECISION=native or auto"
            )
        return LLMPrecisionChoice("native", "auto: the int8 step is CosyVoice 2's only so far")
    if setting == "int8":
        if not runs_int8:
            raise ModelLoadError(
                f"COSYQ_LLM_PRECISION=int8 runs on the CPU with the torch backend only, not "
                f"{backend} on {device.type}: set COSYQ_LLM_PRECISION=native or auto"
            )
        return LLMPrecisionChoice("int8", "COSYQ_LLM_PRECISION=int8 (set explicitly)")
    if not runs_int8:
        return LLMPrecisionChoice("native", f"auto: int8 is CPU-only ({backend} on {device.type})")
    host = host or host_cpu()
    kind = host_class(host)
    pays, measured = MEASURED.get(kind, (False, f"no int8 measurement on a {kind} host"))
    return LLMPrecisionChoice("int8" if pays else "native", f"auto, {host.model}: {measured}")


def int8_speech_tokens(loaded: LoadedModel, *, cache_dir: Path, threads: int) -> ModuleSpeechTokens:
    """The LLM stage with the int8 ONNX Runtime step (its graph built into `cache_dir` once
    per checkpoint); the loaded torch LLM keeps only its embedding lookups to do."""
    from workers.model.llm.ort_decoder import load_ort_llm  # noqa: PLC0415 (onnx on demand)

    ort_llm = load_ort_llm(
        loaded.llm,
        cache_dir=cache_dir,
        checkpoint_hash=loaded.checkpoint_hash,
        threads=threads,
    )
    return ModuleSpeechTokens(ort_llm)
