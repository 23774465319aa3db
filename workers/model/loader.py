"""Load a whole CosyVoice 2 model directory: configs from the directory, strict checkpoints.

`dims -> modules on meta -> strict load (assign, no second copy) -> device/dtype`, per stage.
Below fp32, the LLM's and the flow's checkpoints are converted tensor by tensor as they are read
from the mapped file (its fp32 pages released as they go), so fp32 never sits beside bf16; on
CPU the LLM's text table stays in the mapped file and only the rows looked up become resident,
and bf16 linear and flow convolution weights are then packed in oneDNN's layout
(`cpu_linear.pack_linear_weights`, `cpu_conv.pack_conv_weights`). Which kernels run is
`kernel_policy.kernel_policy(device, dtype)`, decided here once: on CUDA or MPS none of the
CPU kernels (plain `F.linear`, no packing, no fusion).
Hyperparameters come only from the directory (`cosyvoice2.yaml` read as plain data and
`CosyVoice-BlankEN/config.json`); any missing or inconsistent file raises `ModelLoadError`
naming it, before a worker takes a job.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from shared.errors import ModelLoadError
from workers.model.causal_hift.config import CausalHiFTConfig
from workers.model.causal_hift.model import CausalHiFTGenerator, build_causal_hift
from workers.model.checkpoint import can_map, read_state_dict
from workers.model.directory import (
    CHECKPOINTS,
    ModelDirectory,
    checkpoint_hashes,
    combined_hash,
)
from workers.model.dit.config import DiTFlowConfig
from workers.model.dit.model import CausalMaskedDiffWithDiT, build_dit_flow
from workers.model.features import MelConfig
from workers.model.flow.config import FlowConfig
from workers.model.flow.model import CausalMaskedDiffWithXvec, build_flow
from workers.model.heap import release_freed_heap
from workers.model.hift.config import HiFTConfig
from workers.model.hift.model import HiFTGenerator, build_hift
from workers.model.kernel_policy import (
    KernelPolicy,
    apply_llm_policy,
    apply_stage_policy,
    kernel_policy,
)
from workers.model.llm.cosyvoice3 import cosyvoice3_variant
from workers.model.llm.model import TEXT_TABLE_KEY, TIED_HEAD_KEY, LLMConfig, Qwen2LM, build_llm


@dataclass(frozen=True)
class ModelConfigs:
    """Every stage's hyperparameters, as read from one model directory."""

    llm: LLMConfig
    flow: FlowConfig
    hift: HiFTConfig
    mel: MelConfig

    @classmethod
    def from_directory(cls, directory: ModelDirectory) -> ModelConfigs:
        if directory.family != "cosyvoice2":
            raise ModelLoadError(
                f"{directory.root}: a CosyVoice 3 model directory (cosyvoice3.yaml), where "
                "CosyVoice 2's configs were asked for (`family_configs` reads either)"
            )
        doc = directory.yaml
        return cls(
            llm=LLMConfig.from_model_yaml(doc, directory.qwen_config),
            flow=FlowConfig.from_model_yaml(doc),
            hift=HiFTConfig.from_model_yaml(doc),
            mel=MelConfig.from_model_yaml(doc),
        )

    def with_flow_steps(self, steps: int) -> ModelConfigs:
        """The same configs with the flow solved in `steps` Euler steps."""
        return dataclasses.replace(self, flow=self.flow.with_steps(steps))


@dataclass(frozen=True)
class CosyVoice3Configs:
    """Every CosyVoice 3 stage's hyperparameters, as read from one model directory."""

    llm: LLMConfig
    flow: DiTFlowConfig
    hift: CausalHiFTConfig
    mel: MelConfig

    @classmethod
    def from_directory(cls, directory: ModelDirectory) -> CosyVoice3Configs:
        if directory.family != "cosyvoice3":
            raise ModelLoadError(
                f"{directory.root}: not a CosyVoice 3 directory (no cosyvoice3.yaml)"
            )
        doc = directory.yaml
        return cls(
            llm=cosyvoice3_variant(LLMConfig.from_model_yaml(doc, directory.qwen_config)),
            flow=DiTFlowConfig.from_model_yaml(doc),
            hift=CausalHiFTConfig.from_model_yaml(doc),
            mel=MelConfig.from_model_yaml(doc),
        )

    def with_flow_steps(self, steps: int) -> CosyVoice3Configs:
        """The same configs with the flow solved in `steps` Euler steps."""
        if steps < 1:
            raise ValueError(f"flow steps must be >= 1, got {steps}")
        cfm = dataclasses.replace(self.flow.cfm, n_timesteps=steps)
        return dataclasses.replace(self, flow=dataclasses.replace(self.flow, cfm=cfm))


def family_configs(directory: ModelDirectory) -> ModelConfigs | CosyVoice3Configs:
    """The configs of whichever family the directory holds (its yaml decides)."""
    if directory.family == "cosyvoice3":
        return CosyVoice3Configs.from_directory(directory)
    return ModelConfigs.from_directory(directory)


@dataclass(frozen=True)
class LoadedCosyVoice3:
    """CosyVoice 3's three stages on one device (fp32 model code; not yet in the engine)."""

    directory: ModelDirectory
    configs: CosyVoice3Configs
    llm: Qwen2LM
    flow: CausalMaskedDiffWithDiT
    hift: CausalHiFTGenerator


def load_cosyvoice3(root: Path, *, device: torch.device | str = "cpu") -> LoadedCosyVoice3:
    """Check the layout, read the configs, load each checkpoint strictly onto `device`."""
    directory = ModelDirectory(Path(root))
    directory.check_layout()
    configs = CosyVoice3Configs.from_directory(directory)
    paths = {stage: directory.checkpoint(stage) for stage in CHECKPOINTS}
    llm = build_llm(configs.llm, read_state_dict(paths["llm"]), source=paths["llm"], device=device)
    flow = build_dit_flow(
        configs.flow, read_state_dict(paths["flow"]), device=device, source=paths["flow"]
    )
    hift_state = read_state_dict(paths["hift"], mmap=False)
    hift = build_causal_hift(configs.hift, hift_state, device=device, source=paths["hift"])
    return LoadedCosyVoice3(directory, configs, llm, flow, hift)


@dataclass(frozen=True)
class LoadedModel:
    """The three stages on one device, plus what identifies the weights."""

    directory: ModelDirectory
    configs: ModelConfigs | CosyVoice3Configs
    llm: Qwen2LM
    # None when another runtime (Core ML) replaces it; CosyVoice 3: the DiT flow, causal HiFT
    flow: CausalMaskedDiffWithXvec | CausalMaskedDiffWithDiT | None
    hift: HiFTGenerator | CausalHiFTGenerator | None
    checkpoint_hashes: dict[str, str]
    device: torch.device
    dtype: torch.dtype
    kernels: KernelPolicy

    @property
    def checkpoint_hash(self) -> str:
        return combined_hash(self.checkpoint_hashes)

    @property
    def family(self) -> str:
        return self.directory.family


def load_model(
    root: Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    hash_cache_dir: Path | None = None,
    torch_stages: frozenset[str] = frozenset({"flow", "hift"}),
    flow_steps: int | None = None,
    policy: KernelPolicy | None = None,
) -> LoadedModel:
    """Check the layout, read configs, load each checkpoint strictly onto `device`.

    The LLM always loads; `torch_stages` names which of flow and HiFT run in PyTorch (under
    Core ML neither does, and their weights are not loaded at all). `flow_steps` replaces the
    model's Euler steps (its 10) in the torch flow: fewer is faster and coarser. `policy`: the
    kernels (default `kernel_policy(device, dtype)`; a test loads a CUDA policy on the CPU).
    A CosyVoice 3 directory loads its DiT flow and causal HiFT (the LLM is the same class
    with CosyVoice 3's config); its DiT flow gets the same CPU kernels as CosyVoice 2's flow
    (packed bf16 weights, fused q/k/v, blocked attention), its causal HiFT none so far.
    """
    directory = ModelDirectory(Path(root))
    directory.check_layout()
    configs = family_configs(directory)
    if flow_steps is not None:
        configs = configs.with_flow_steps(flow_steps)
    device = torch.device(device)
    policy = policy or kernel_policy(device, dtype)  # CPU kernels on the CPU only, chosen once
    llm_path, flow_path, hift_path = (directory.checkpoint(s) for s in ("llm", "flow", "hift"))
    convert = None if dtype == torch.float32 else dtype  # fp32 keeps the mapped tensors
    mapped_text_table = convert is not None and device.type == "cpu" and can_map(llm_path)
    keep = (TIED_HEAD_KEY, TEXT_TABLE_KEY) if mapped_text_table else (TIED_HEAD_KEY,)
    llm_state = read_state_dict(llm_path, dtype=convert, keep=keep)
    llm = build_llm(
        configs.llm,
        llm_state,
        source=llm_path,
        device=device,
        dtype=dtype,
        mapped_text_table=mapped_text_table,
        kernel=policy.llm_linear,
    )
    del llm_state  # the mapping stays only for what the model still uses of it
    apply_llm_policy(llm, policy)  # CPU bf16: fused q/k/v, gate/up, packed weights
    flow: CausalMaskedDiffWithXvec | CausalMaskedDiffWithDiT | None = None
    hift: HiFTGenerator | CausalHiFTGenerator | None = None
    if isinstance(configs, CosyVoice3Configs):
        flow, hift = _cosyvoice3_stages(configs, directory, torch_stages, device, dtype)
        if flow is not None:  # as CosyVoice 2's flow: each piece's flow runs alone in bf16
            apply_stage_policy(flow, policy, rows_alone=True)
    if isinstance(configs, ModelConfigs) and "flow" in torch_stages:
        flow_state = read_state_dict(flow_path, dtype=convert)
        flow2 = build_flow(configs.flow, flow_state, device=device, dtype=dtype, source=flow_path)
        del flow_state
        # In bf16 each piece's flow runs alone (COSYQ_BATCH_FLOW=joined gives up the bits anyway)
        apply_stage_policy(flow2, policy, rows_alone=True)
        flow = flow2
    if isinstance(configs, ModelConfigs) and "hift" in torch_stages:
        # Read into memory, not mapped: every weight-normed kernel is folded into a new tensor
        # (and below fp32 converted), so mapped pages would stay resident beside the results.
        hift_state = read_state_dict(hift_path, mmap=False)
        hift2 = build_hift(configs.hift, hift_state, device=device, dtype=dtype, source=hift_path)
        del hift_state
        # packed convs on AMX only: elsewhere +40 MB of working memory for 0.91x
        apply_stage_policy(hift2, policy, rows_alone=False)
        hift = hift2
    release_freed_heap()  # what conversion, fusion and packing freed
    return LoadedModel(
        directory=directory,
        configs=configs,
        llm=llm,
        flow=flow,
        hift=hift,
        checkpoint_hashes=checkpoint_hashes(directory, hash_cache_dir),
        device=device,
        dtype=dtype,
        kernels=policy,
    )


def _cosyvoice3_stages(
    configs: CosyVoice3Configs,
    directory: ModelDirectory,
    torch_stages: frozenset[str],
    device: torch.device,
    dtype: torch.dtype,
) -> tuple[CausalMaskedDiffWithDiT | None, CausalHiFTGenerator | None]:
    """CosyVoice 3's DiT flow and causal HiFT (the F0 predictor stays float64 in any dtype)."""
    flow = hift = None
    if "flow" in torch_stages:
        path = directory.checkpoint("flow")
        convert = None if dtype == torch.float32 else dtype
        flow = build_dit_flow(
            configs.flow, read_state_dict(path, dtype=convert), device=device, dtype=dtype,
            source=path,
        )  # fmt: skip
    if "hift" in torch_stages:
        path = directory.checkpoint("hift")
        state = read_state_dict(path, mmap=False)
        hift = build_causal_hift(configs.hift, state, device=device, dtype=dtype, source=path)
    return flow, hift
