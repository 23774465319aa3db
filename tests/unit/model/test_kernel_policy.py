"""The kernel policy: our CPU kernels on the CPU only, chosen once at load, never on CUDA/MPS."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from workers.model.cpu_linear import bf16_packing_available, onednn_available
from workers.model.kernel_policy import cpu_kernels_in, kernel_policy
from workers.model.llm.qwen2 import KVCache
from workers.model.loader import LoadedModel, load_model

CUDA = torch.device("cuda")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("device", ["cuda", "cuda:1", "mps"])
def test_a_gpu_gets_plain_torch_kernels(device: str, dtype: torch.dtype) -> None:
    policy = kernel_policy(torch.device(device), dtype)
    assert not policy.cpu_kernels
    assert (policy.llm_linear, policy.flow_linear) == ("torch", "torch")
    assert not policy.pack_weights and not policy.fuse_projections
    assert policy.static_decode == device.startswith("cuda")


def test_the_cpu_keeps_its_kernels_and_dynamic_decode() -> None:
    policy = kernel_policy(torch.device("cpu"), torch.float32)
    assert policy.cpu_kernels and not policy.static_decode
    assert policy.llm_linear == ("onednn" if onednn_available() else "torch")


def _ops_of_a_synthesis(model: LoadedModel) -> set[str]:
    """Every op name a prefill + decode step, a flow pass and a HiFT pass run."""
    llm, flow, hift = model.llm, model.flow, model.hift
    assert flow is not None and hift is not None
    config = model.configs
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU]) as prof:
        cache = KVCache(config.llm.backbone, 64, dtype=model.dtype)
        prefix = llm.prefix_embeddings(
            torch.tensor([1, 2, 3]), torch.tensor([4, 5]), torch.tensor([6, 7])
        )
        llm.step_logp(prefix, cache)
        llm.step_logp(llm.speech_embedding(torch.tensor([[3]])), cache)
        tokens = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]])
        mel, _ = flow.inference(
            token=tokens,
            prompt_token=torch.zeros(1, 0, dtype=torch.long),
            prompt_feat=torch.zeros(1, 0, config.flow.mel_bins, dtype=model.dtype),
            embedding=torch.zeros(1, config.flow.spk_embed_dim, dtype=model.dtype),
        )
        hift.inference(mel.to(model.dtype))
    return {event.key for event in prof.key_averages()}


def _cpu_kernel_ops(ops: set[str]) -> set[str]:
    """Ours: oneDNN's linear/conv on packed weights, blocked attention (`aten::mkldnn_*` is
    PyTorch's own plain CPU convolution, which any CPU tensor takes)."""
    ours = ("mkldnn::_linear_pointwise", "mkldnn::_convolution_pointwise", "cosyq::cpu_attention")
    return {op for op in ops if op in ours}


def test_a_cuda_policy_load_reaches_no_cpu_kernel(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Loaded through the real loader with CUDA's policy (on the CPU, the only device here):
    no oneDNN op, packed weight, fused product or blocked attention runs; the CPU's own policy
    on the same weights does use them (so this check can fail)."""
    dtype = torch.bfloat16
    as_cuda = load_model(
        tiny_model_dir, dtype=dtype, hash_cache_dir=tmp_path, policy=kernel_policy(CUDA, dtype)
    )
    assert as_cuda.kernels.device_type == "cuda"
    assert cpu_kernels_in([as_cuda.llm, as_cuda.flow, as_cuda.hift]) == []  # type: ignore[list-item]
    assert _cpu_kernel_ops(_ops_of_a_synthesis(as_cuda)) == set()
    if not bf16_packing_available():
        pytest.skip("this CPU has no native bf16: the CPU policy has nothing to contrast")
    as_cpu = load_model(tiny_model_dir, dtype=dtype, hash_cache_dir=tmp_path)
    assert cpu_kernels_in([as_cpu.llm]) != []
    assert _cpu_kernel_ops(_ops_of_a_synthesis(as_cpu)) != set()
