"""Load a conversion on macOS: manifest checks, compiled-model cache, compute units, warm-up.

`load_coreml_stages` refuses a conversion of the other family (CosyVoice 2 vs 3), a stale
conversion (checkpoint hashes differ from the manifest's), a modified package (content hash),
and a conversion missing a stage; then it compiles each
package once per hash (`cache`) and opens the compiled model with the chosen compute units.
The LLM is loaded when the conversion has one (macOS 15 target) and the worker runs one job at
a time (`llm=True`); else it stays on PyTorch, which batches it (see docs/coreml.md).
coremltools is imported only here and only when this runs.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from shared.errors import ModelLoadError
from workers.coreml.cache import COMPILE_LOCK_TIMEOUT_S, compiled_model_path
from workers.coreml.causal_runtime import CoreMLCausalHiFT
from workers.coreml.convert.compat import load_coremltools
from workers.coreml.llm_runtime import CoreMLQwen2LM, embeddings_only
from workers.coreml.manifest import (
    Manifest,
    check_family,
    check_flow_steps,
    check_packages,
    check_sources,
    read_manifest,
)
from workers.coreml.platform import COMPUTE_UNITS_DEVICE, MACOS_ONLY
from workers.coreml.runtime import CoreMLFlow, CoreMLHiFT
from workers.coreml.stages import (
    ALL_STAGES,
    FLOW_CFM,
    FLOW_ENCODER,
    HIFT_DECODE,
    HIFT_SOURCE,
    LLM,
    LLM_CHECKPOINT,
    LLM_DECODE,
    LLM_PREFILL,
)
from workers.model.checkpoint import read_state_dict
from workers.model.directory import ModelDirectory
from workers.model.llm.qwen2 import KVCache
from workers.model.loader import CosyVoice3Configs, family_configs

WARM_UP_TOKENS = 50  # prompt + target tokens of the warm-up synthesis (100 mel frames, 2 s)
WARM_UP_LLM_POSITIONS = 8  # prefill length of the LLM warm-up (then two decode steps)
# The Neural Engine has been reported to fail compiling KV-cache states (COREML.md), so the LLM
# asks for the GPU where the flow and HiFT may use the Neural Engine.
LLM_COMPUTE_UNITS = {
    "ALL": "CPU_AND_GPU",
    "CPU_AND_NE": "CPU_AND_GPU",
    "CPU_AND_GPU": "CPU_AND_GPU",
    "CPU_ONLY": "CPU_ONLY",
}


def require_macos() -> None:
    if sys.platform != "darwin":
        raise ModelLoadError(MACOS_ONLY)


@dataclass
class CoreMLStages:
    """The loaded stages of one conversion: flow, HiFT, and the LLM when it was converted."""

    flow: CoreMLFlow
    hift: CoreMLHiFT | CoreMLCausalHiFT  # CosyVoice 3: the causal HiFT (fixed noise buffer)
    manifest: Manifest
    compute_units: str
    llm: CoreMLQwen2LM | None = None  # None: the conversion has no LLM; it stays on PyTorch

    @property
    def device(self) -> str:
        return COMPUTE_UNITS_DEVICE[self.compute_units]

    @torch.inference_mode()
    def _warm_batches(self, mel: torch.Tensor, source: torch.Tensor) -> None:
        """One call of every batch size above 1 (the shapes a Mac specialises on first use)."""
        for size in self.flow.batch_sizes.sizes[1:]:
            zeros = torch.zeros(size, mel.size(1), mel.size(-1))
            self.flow.solve(zeros, zeros, torch.ones(size, 1, mel.size(-1)), zeros[:, :, 0], zeros)
        if isinstance(self.hift, CoreMLCausalHiFT):
            return  # one piece per vocoder call (`CausalVocoder`): batch 1 only
        for size in self.hift.batch_sizes.sizes[1:]:
            mels = mel.expand(size, -1, -1)
            self.hift.decode(mels, source.expand(size, -1, -1))

    def warm_up(self) -> None:
        """A short synthesis through the flow and HiFT packages, every CFM shape bucket, every
        batch size of a batched conversion, and a prefill plus two decode steps of the LLM."""
        mel_bins, ratio = self.flow.config.mel_bins, self.flow.config.token_mel_ratio
        tokens = WARM_UP_TOKENS
        if self.flow.buckets:  # stay within the largest bucket
            tokens = min(tokens, self.flow.buckets[-1] // ratio)
        prompt = tokens // 2
        mel, _ = self.flow.inference(
            torch.zeros(1, tokens - prompt, dtype=torch.int32),
            torch.zeros(1, prompt, dtype=torch.int32),
            torch.zeros(1, ratio * prompt, mel_bins),
            torch.ones(1, self.flow.config.spk_embed_dim),
        )
        source = self.hift.inference(mel, generator=torch.Generator().manual_seed(0)).source
        self._warm_batches(mel, source)
        for frames in self.flow.buckets:
            zeros = torch.zeros(1, mel_bins, frames)
            self.flow.solve(zeros, zeros, torch.ones(1, 1, frames), zeros[:, :, 0], zeros)
        if self.llm is not None:
            backbone = self.llm.config.backbone
            cache = KVCache(backbone, WARM_UP_LLM_POSITIONS + 2)
            self.llm.step_logp(torch.zeros(1, WARM_UP_LLM_POSITIONS, backbone.hidden_size), cache)
            for _ in range(2):
                self.llm.step_logp(torch.zeros(1, 1, backbone.hidden_size), cache)


def load_coreml_stages(
    model_dir: Path,
    *,
    coreml_dir: Path,
    cache_dir: Path,
    compute_units: str | None = None,
    compile_timeout_s: float = COMPILE_LOCK_TIMEOUT_S,
    llm: bool = True,
    flow_steps: int | None = None,
) -> CoreMLStages:
    """Check and open `coreml_dir`'s packages for `model_dir` (macOS only).

    `compute_units` None means the default recorded at conversion (`--compute-units`);
    `flow_steps`: the Euler steps the engine asks for (None: the model's own); a conversion
    made with other steps is refused before anything compiles;
    `compile_timeout_s` bounds the wait for another process compiling the same package;
    `llm` False leaves a converted LLM unopened (a batching worker runs it on PyTorch).
    """
    require_macos()
    manifest = read_manifest(coreml_dir)
    hashes = cache_dir / "hashes"
    check_sources(manifest, model_dir, hashes)
    directory = ModelDirectory(model_dir)
    check_family(manifest, directory.family)
    check_flow_steps(manifest, family_configs(directory).flow.cfm.n_timesteps, flow_steps)
    missing = [stage for stage in ALL_STAGES if stage not in manifest.packages]
    if missing:
        raise ModelLoadError(f"{coreml_dir}: conversion lacks {', '.join(missing)}; convert again")
    check_packages(manifest, coreml_dir, hashes)
    units = compute_units or manifest.compute_units
    if units not in COMPUTE_UNITS_DEVICE:
        raise ModelLoadError(f"compute units {units!r}: choose one of {list(COMPUTE_UNITS_DEVICE)}")
    opener = _Opener(manifest, coreml_dir, cache_dir, compile_timeout_s)
    models = {stage: opener.open(stage, units) for stage in ALL_STAGES}
    flow, hift = runtime_stages(manifest, directory, models, flow_steps=flow_steps)
    coreml_llm = None
    if llm and LLM in manifest.packages:
        coreml_llm = _open_llm(opener, model_dir, LLM_COMPUTE_UNITS[units])
    return CoreMLStages(flow, hift, manifest, units, coreml_llm)


def runtime_stages(
    manifest: Manifest,
    directory: ModelDirectory,
    models: dict[str, Any],
    *,
    flow_steps: int | None = None,
) -> tuple[CoreMLFlow, CoreMLHiFT | CoreMLCausalHiFT]:
    """The flow and HiFT runtime stages over opened `models` (by stage), shaped as the
    manifest says: its family (the directory's, else refused), the CFM's buckets and Euler
    steps (those the engine asks for, `flow_steps`, None: the model's own, else refused) and
    each stage's batch sizes (the same for both of a stage's packages, else refused)."""
    check_family(manifest, directory.family)
    configs = family_configs(directory)
    steps = check_flow_steps(manifest, configs.flow.cfm.n_timesteps, flow_steps)
    packages = manifest.packages
    for first, second in ((FLOW_ENCODER, FLOW_CFM), (HIFT_SOURCE, HIFT_DECODE)):
        if packages[first].batch_sizes != packages[second].batch_sizes:
            raise ModelLoadError(
                f"{first} and {second} have different batch sizes "
                f"({packages[first].batch_sizes} vs {packages[second].batch_sizes}); "
                "convert again"
            )
    flow = CoreMLFlow(
        configs.with_flow_steps(steps).flow,
        models[FLOW_ENCODER],
        models[FLOW_CFM],
        buckets=packages[FLOW_CFM].buckets,
        batch_sizes=packages[FLOW_CFM].batch_sizes,
    )
    source, decode, sizes = models[HIFT_SOURCE], models[HIFT_DECODE], packages[HIFT_DECODE]
    hift: CoreMLHiFT | CoreMLCausalHiFT
    if isinstance(configs, CosyVoice3Configs):  # the causal HiFT: the fixed buffer as noise
        hift = CoreMLCausalHiFT(configs.hift, source, decode, batch_sizes=sizes.batch_sizes)
    else:
        hift = CoreMLHiFT(configs.hift, source, decode, batch_sizes=sizes.batch_sizes)
    return flow, hift


def _open_llm(opener: _Opener, model_dir: Path, units: str) -> CoreMLQwen2LM:
    directory = ModelDirectory(model_dir)
    config = family_configs(directory).llm  # CosyVoice 3: its own head and stop ids
    embeddings = embeddings_only(config, read_state_dict(directory.path(LLM_CHECKPOINT)))
    prefill = opener.open(LLM, units, function=LLM_PREFILL)
    decode = opener.open(LLM, units, function=LLM_DECODE)
    capacity = opener.manifest.packages[LLM].dims["E"].upper
    return CoreMLQwen2LM(config, embeddings, prefill, decode, capacity=capacity)


@dataclass(frozen=True)
class _Opener:
    """Compiles (once, through the shared cache) and opens one conversion's packages."""

    manifest: Manifest
    folder: Path
    cache_dir: Path
    compile_timeout_s: float

    def open(self, stage: str, units: str, *, function: str | None = None) -> Any:
        ct = load_coremltools()
        entry = self.manifest.packages[stage]

        def compile_package(package: Path, destination: Path) -> object:
            return ct.models.utils.compile_model(str(package), str(destination))

        compiled = compiled_model_path(
            self.folder / entry.path,
            entry.sha256,
            self.cache_dir,
            compile_package,
            lock_timeout_s=self.compile_timeout_s,
        )
        try:
            return ct.models.CompiledMLModel(
                str(compiled), compute_units=ct.ComputeUnit[units], function_name=function
            )
        except Exception as e:  # Core ML reports load failures with its own exception types
            raise ModelLoadError(f"{compiled}: Core ML could not load it ({e})") from e
