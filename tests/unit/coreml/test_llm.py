"""The stateful LLM package (prefill + decode, macOS 15) and the runtime that drives it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from shared.errors import InvalidRequestError
from tests.doubles.coreml_predictors import TorchStatefulPredictor
from tests.doubles.mil_interpreter import MILPredictor
from workers.coreml.convert.build import (
    convert_llm_package,
    write_manifest,
)
from workers.coreml.convert.compat import load_coremltools
from workers.coreml.convert.llm_convert import convert_llm
from workers.coreml.convert.llm_graph import StatefulLLMGraph
from workers.coreml.convert.options import ConvertOptions
from workers.coreml.llm_runtime import CoreMLQwen2LM, embeddings_only
from workers.coreml.manifest import package_sha256, read_manifest
from workers.coreml.stages import LLM, LLM_DECODE, LLM_PREFILL, llm_specs
from workers.model.checkpoint import read_state_dict
from workers.model.directory import ModelDirectory
from workers.model.llm.model import Qwen2LM, iter_speech_tokens
from workers.model.llm.qwen2 import KVCache
from workers.model.loader import load_model
from workers.tools.reference.llm import LOGITS_TOLERANCE, load_reference_llm, step_logps
from workers.tools.reference.parity import ReferenceSet

CAPACITY = 64


@pytest.fixture(scope="module")
def ref(reference_dir: Path) -> ReferenceSet:
    return ReferenceSet(reference_dir)


@pytest.fixture(scope="module")
def llm(ref: ReferenceSet) -> Qwen2LM:
    return load_reference_llm(ref, torch.device("cpu"), kernel="torch")


@pytest.fixture(scope="module")
def package(micro_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The micro model's llm.pt converted as `cosyq-worker convert` does; its folder."""
    options = ConvertOptions(target="macOS15", llm_capacity=CAPACITY)
    out_dir = tmp_path_factory.mktemp("llm")
    entry = convert_llm_package(ModelDirectory(micro_model_dir), out_dir, options)
    write_manifest(
        {LLM: entry}, out_dir, options=options, sources={}, model_name="micro", flow_steps=None
    )
    return out_dir


def coreml_llm(llm: Qwen2LM, ref: ReferenceSet, capacity: int = CAPACITY) -> CoreMLQwen2LM:
    graph = StatefulLLMGraph(llm, capacity)
    specs = llm_specs(llm.config.backbone.hidden_size, llm.config.decoder_size)
    embeddings = embeddings_only(llm.config, read_state_dict(ref.checkpoint("llm")))
    return CoreMLQwen2LM(
        llm.config,
        embeddings,
        TorchStatefulPredictor(graph, specs[LLM_PREFILL]),
        TorchStatefulPredictor(graph, specs[LLM_DECODE]),
        capacity=capacity,
    )


def test_one_package_two_functions_sharing_weights_and_states(
    package: Path, micro_model_dir: Path
) -> None:
    entry = read_manifest(package).packages[LLM]
    path = package / entry.path
    ct = load_coremltools()
    spec = ct.models.MLModel(str(path), skip_model_load=True).get_spec()
    functions = {f.name: f for f in spec.description.functions}
    assert set(functions) == {"prefill", "decode"}
    assert spec.description.defaultFunctionName == "decode"
    state_shape = [2, 1, 2, CAPACITY, 16]  # layers, batch, kv heads, positions, head dim
    for function in functions.values():
        states = {s.name: s.type.stateType.arrayType for s in function.state}
        assert set(states) == {"k_cache", "v_cache"}
        assert all(list(a.shape) == state_shape for a in states.values())
        assert [o.name for o in function.output] == ["logits"]
    ranges = functions["prefill"].input[0].type.multiArrayType.shapeRange.sizeRanges
    assert (ranges[1].lowerBound, ranges[1].upperBound) == (1, CAPACITY)
    assert list(functions["decode"].input[0].type.multiArrayType.shape) == [1, 1, 64]
    llm = load_model(micro_model_dir).llm
    used = sum(p.numel() for n, p in llm.named_parameters() if "embed" not in n)
    assert entry.weights_bytes < 1.2 * 2 * used  # fp16, stored once for both functions
    assert set(entry.functions) == {LLM_PREFILL, LLM_DECODE}
    assert entry.functions[LLM_DECODE][0].shape == (1, 1, 64)
    assert [s.name for s in entry.states] == ["k_cache", "v_cache"]
    assert entry.dims["E"].upper == CAPACITY and entry.sha256 == package_sha256(path)


def test_the_runtime_reproduces_the_reference_step_log_probs(
    llm: Qwen2LM, ref: ReferenceSet
) -> None:
    arrays = ref.arrays("llm_reference.npz")
    model: Any = coreml_llm(llm, ref)
    logp = step_logps(model, arrays)
    assert float(np.abs(logp.numpy() - arrays["infer_step_logp"]).max()) <= LOGITS_TOLERANCE
    assert model.prefill.calls == 1 and model.decode.calls == len(logp) - 1


def test_sampling_through_the_runtime_gives_the_reference_tokens(
    llm: Qwen2LM, ref: ReferenceSet
) -> None:
    arrays = ref.arrays("llm_reference.npz")
    expected = arrays["infer_sampled_tokens"].reshape(-1).tolist()
    model: Any = coreml_llm(llm, ref)
    ids = {k: torch.from_numpy(arrays[k].astype(np.int64)).reshape(-1)
           for k in ("text", "prompt_text", "prompt_speech_token")}  # fmt: skip
    tokens = iter_speech_tokens(
        model,
        ids["text"],
        prompt_text=ids["prompt_text"],
        prompt_speech=ids["prompt_speech_token"],
        generator=torch.Generator().manual_seed(int(arrays["infer_seed"])),
    )
    assert [next(tokens) for _ in expected] == expected


def test_requests_keep_separate_states(llm: Qwen2LM, ref: ReferenceSet) -> None:
    model = coreml_llm(llm, ref)
    hidden = llm.config.backbone.hidden_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randn(1, n, hidden, generator=g) for n in (6, 9)]
    step = torch.randn(1, 1, hidden, generator=g)

    def run(cache: KVCache, prompt: torch.Tensor) -> torch.Tensor:
        model.step_logp(prompt, cache)
        return model.step_logp(step, cache)

    alone = [run(KVCache(llm.config.backbone, 16), p) for p in prompts]
    caches = [KVCache(llm.config.backbone, 16) for _ in prompts]
    firsts = [model.step_logp(p, c) for p, c in zip(prompts, caches, strict=True)]
    interleaved = [model.step_logp(step, c) for c in caches]
    assert all(torch.isfinite(f).all() for f in firsts)
    for a, b in zip(alone, interleaved, strict=True):
        torch.testing.assert_close(a, b)


def test_a_request_longer_than_the_kv_cache_is_refused(llm: Qwen2LM, ref: ReferenceSet) -> None:
    model = coreml_llm(llm, ref, capacity=8)
    cache = KVCache(llm.config.backbone, 32)  # the worst case may exceed; the use may not
    hidden = llm.config.backbone.hidden_size
    model.step_logp(torch.zeros(1, 7, hidden), cache)
    model.step_logp(torch.zeros(1, 1, hidden), cache)
    refused = r"9 positions .* exceed the Core ML KV cache of 8"
    with pytest.raises(InvalidRequestError, match=refused):
        model.step_logp(torch.zeros(1, 1, hidden), cache)


def test_the_converted_llm_reproduces_the_reference_steps(
    llm: Qwen2LM, ref: ReferenceSet, tmp_path: Path
) -> None:
    """The fp32 program itself, states and all, run by the MIL interpreter."""
    path = tmp_path / "llm.mlpackage"
    convert_llm(llm, ConvertOptions(precision="fp32", target="macOS15"), path, capacity=CAPACITY)
    embeddings = embeddings_only(llm.config, read_state_dict(ref.checkpoint("llm")))
    model: Any = CoreMLQwen2LM(
        llm.config,
        embeddings,
        MILPredictor(path, LLM_PREFILL),
        MILPredictor(path, LLM_DECODE),
        capacity=CAPACITY,
    )
    arrays = ref.arrays("llm_reference.npz")
    logp = step_logps(model, arrays)
    assert float(np.abs(logp.numpy() - arrays["infer_step_logp"]).max()) <= LOGITS_TOLERANCE


def test_rotary_angles_stay_float32_in_the_fp16_package(package: Path) -> None:
    ct = load_coremltools()
    spec = ct.models.MLModel(str(package / "llm.mlpackage"), skip_model_load=True).get_spec()
    for name, function in spec.mlProgram.functions.items():
        (block,) = function.block_specializations.values()
        dtypes: dict[str, set[int]] = {}
        for node in block.operations:
            for out in node.outputs[:1]:
                dtypes.setdefault(node.type, set()).add(out.type.tensorType.dataType)
        assert dtypes["sin"] == dtypes["cos"] == {ct.proto.MIL_pb2.FLOAT32}, name
        assert dtypes["linear"] == {ct.proto.MIL_pb2.FLOAT16}, name
