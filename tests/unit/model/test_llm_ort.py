"""The int8 ONNX Runtime step (`ort_decoder`) against our fp32 PyTorch LLM, on the tiny model."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from shared.errors import InvalidRequestError
from workers.model.cpu_linear import PACKED_ROWS_HINT, bf16_packing_available
from workers.model.llm.model import Qwen2LM
from workers.model.llm.ort_decoder import OrtSpeechLM, load_ort_llm, ort_cache_path
from workers.model.llm.ort_graph import QuantScheme, build_step_graph, quantized_blocks
from workers.model.llm.qwen2 import KVCache
from workers.model.loader import LoadedModel, load_model
from workers.tools.bench.llm_agreement import compare_llm, free_running

MIN_SNR_DB = 40.0  # the bar for log-probs (measured ~66 dB on the tiny model)
STEPS = 20


@pytest.fixture(scope="module")
def loaded(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    return load_model(tiny_model_dir, hash_cache_dir=tmp_path_factory.mktemp("hashes"))


@pytest.fixture(scope="module")
def ort_llm(loaded: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> OrtSpeechLM:
    return load_ort_llm(
        loaded.llm,
        cache_dir=tmp_path_factory.mktemp("onnx"),
        checkpoint_hash=loaded.checkpoint_hash,
        threads=1,
    )


def snr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    ref, got = reference.double(), other.double()
    finite = torch.isfinite(ref)
    noise = ((ref[finite] - got[finite]) ** 2).sum()
    return float(10 * torch.log10((ref[finite] ** 2).sum() / noise))


def prefix_of(llm: Qwen2LM) -> torch.Tensor:
    return llm.prefix_embeddings(torch.arange(3, 40), torch.arange(50, 60), torch.arange(0, 25))


@torch.inference_mode()
def test_int8_log_probs_track_fp32_over_a_prefill_and_decode_steps(
    loaded: LoadedModel, ort_llm: OrtSpeechLM
) -> None:
    llm = loaded.llm
    prefix = prefix_of(llm)
    backbone = llm.config.backbone
    ours, theirs = KVCache(backbone, 128), KVCache(backbone, 128)
    expected, got = llm.step_logp(prefix, ours), ort_llm.step_logp(prefix, theirs)
    snrs = [snr_db(expected, got)]
    for step in range(STEPS):
        token = (step * 37) % llm.config.speech_token_size  # the same inputs to both
        embed = llm.speech_embedding.weight[token].view(1, 1, -1)
        expected, got = llm.step_logp(embed, ours), ort_llm.step_logp(embed, theirs)
        snrs.append(snr_db(expected, got))
    assert theirs.length == ours.length == prefix.shape[1] + STEPS
    assert min(snrs) >= MIN_SNR_DB, snrs


def test_int8_samples_mostly_the_same_tokens_at_a_fixed_seed(
    loaded: LoadedModel, ort_llm: OrtSpeechLM
) -> None:
    """Teacher-forced, stop ids masked: the tiny model's speech scores are nearly flat (std
    ~0.6 nats over 6,561 ids) so a 0.004-nat error swaps close candidates; the full-size random
    model's figures are in docs/benchmarks.md. The tiny bar: the same draw on 70% of steps."""
    report = compare_llm(loaded.llm, ort_llm, prefix_of(loaded.llm), steps=200, seed=7)
    assert report.steps == 200 and len(report.snr_db) == 200
    assert report.agreed >= 140, report.lines()
    assert min(report.snr_db) >= 38.0, report.lines()  # centred (measured 41.9-44.2)


def test_rows_of_different_lengths_decode_as_each_alone(
    loaded: LoadedModel, ort_llm: OrtSpeechLM
) -> None:
    llm = loaded.llm
    hidden = llm.config.backbone.hidden_size
    rng = np.random.default_rng(0)
    prompts = [rng.standard_normal((1, n, hidden)).astype(np.float32) for n in (9, 4)]
    step = rng.standard_normal((2, 1, hidden)).astype(np.float32)
    alone = []
    for row, prompt in enumerate(prompts):
        kv = ort_llm.new_kv(1, 32)
        ort_llm.run_rows(kv, prompt, np.array([0], dtype=np.int32))
        alone.append(ort_llm.run_rows(kv, step[row : row + 1], np.array([prompt.shape[1]])))
    batch = ort_llm.new_kv(2, 32)
    for row, prompt in enumerate(prompts):  # each row's prompt written alone into its row
        kv = ort_llm.new_kv(1, 32)
        ort_llm.run_rows(kv, prompt, np.array([0], dtype=np.int32))
        for mine, theirs in zip(batch.keys + batch.values, kv.keys + kv.values, strict=True):
            mine[row] = theirs[0]
    together = ort_llm.run_rows(batch, step, np.array([9, 4], dtype=np.int32))
    np.testing.assert_allclose(together, np.concatenate(alone), atol=1e-4)


def test_a_full_cache_is_refused(loaded: LoadedModel, ort_llm: OrtSpeechLM) -> None:
    cache = KVCache(loaded.llm.config.backbone, 8)
    ort_llm.step_logp(torch.zeros(1, 8, loaded.llm.config.backbone.hidden_size), cache)
    with pytest.raises(InvalidRequestError, match="KV cache full"):
        ort_llm.step_logp(torch.zeros(1, 1, loaded.llm.config.backbone.hidden_size), cache)


def test_the_graph_file_is_built_once_and_reused(loaded: LoadedModel, tmp_path: Path) -> None:
    path = ort_cache_path(tmp_path, loaded.checkpoint_hash)
    load_ort_llm(loaded.llm, cache_dir=tmp_path, checkpoint_hash=loaded.checkpoint_hash, threads=1)
    first = path.stat()
    again = load_ort_llm(
        loaded.llm, cache_dir=tmp_path, checkpoint_hash=loaded.checkpoint_hash, threads=1
    )
    assert path.stat().st_mtime_ns == first.st_mtime_ns and path.stat().st_ino == first.st_ino
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no partial file left
    assert again.session is not None
    assert ort_cache_path(tmp_path, "0" * 64) != path  # another checkpoint, another file


@pytest.mark.parametrize("block", [32, 128])
@pytest.mark.parametrize("symmetric", [True, False])
def test_quantized_blocks_round_trip_within_half_a_step(block: int, symmetric: bool) -> None:
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((6, 300)).astype(np.float32) * 0.02
    weight[0, :block] = np.linspace(0.01, 0.05, block)  # all positive: asymmetric's case
    packed, scales, zeros = quantized_blocks(weight, block=block, symmetric=symmetric)
    blocks = -(-300 // block)
    assert packed.shape == (6, blocks, block) and scales.shape == (6 * blocks,)
    zero = np.full(6 * blocks, 128.0) if zeros is None else zeros.astype(np.float64)
    assert (zeros is None) == symmetric
    restored = (packed.astype(np.float64) - zero.reshape(6, blocks, 1)) * scales.reshape(
        6, blocks, 1
    )
    restored = restored.reshape(6, -1)[:, :300]
    step = np.repeat(scales.reshape(6, blocks), block, axis=1)[:, :300]
    assert np.all(np.abs(restored - weight) <= step / 2 + 1e-9)
    if not symmetric:  # a positive block uses the whole range: a finer step than symmetric's
        sym_scales = quantized_blocks(weight, block=block, symmetric=True)[1]
        assert scales[0] < sym_scales[0] * 0.6


def test_a_scheme_names_its_file_and_refuses_bad_values(tmp_path: Path) -> None:
    assert QuantScheme().tag == ""
    assert ort_cache_path(tmp_path, "ab" * 32) != ort_cache_path(
        tmp_path, "ab" * 32, QuantScheme(head_int8=False)
    )
    assert QuantScheme(block=128, symmetric=False).tag == "-b128a4ah8"
    with pytest.raises(ValueError, match="power of two"):
        QuantScheme(block=48)
    with pytest.raises(ValueError, match="accuracy_level"):
        QuantScheme(accuracy_level=7)


@pytest.mark.parametrize(
    "scheme",
    [QuantScheme(head_int8=False), QuantScheme(symmetric=False, block=128, accuracy_level=0)],
)
def test_other_schemes_track_fp32_too(
    loaded: LoadedModel, scheme: QuantScheme, tmp_path: Path
) -> None:
    ort = load_ort_llm(
        loaded.llm,
        cache_dir=tmp_path,
        checkpoint_hash=loaded.checkpoint_hash,
        threads=1,
        scheme=scheme,
    )
    report = compare_llm(loaded.llm, ort, prefix_of(loaded.llm), steps=10, seed=7)
    assert min(report.raw_snr_db) >= MIN_SNR_DB, report.lines()


def test_free_running_of_a_model_against_itself_agrees_everywhere(
    loaded: LoadedModel, ort_llm: OrtSpeechLM
) -> None:
    itself = free_running(loaded.llm, loaded.llm, prefix_of(loaded.llm), steps=30, seed=7)
    assert (itself.agreed, itself.first_divergence) == (30, None)
    int8 = free_running(loaded.llm, ort_llm, prefix_of(loaded.llm), steps=30, seed=7)
    assert int8.steps == 30 and int8.agreed <= 30


def test_a_bf16_model_packed_for_onednn_gives_the_same_graph(loaded: LoadedModel) -> None:
    """Where `auto` picks bf16 (AVX512-BF16, AMX), the engine packs its Linear weights for oneDNN
    before an int8 step graph may be built from the same model: it reads them back plain."""
    if not bf16_packing_available():
        pytest.skip("no oneDNN bf16 packing on this CPU (needs AVX512-BF16 or AMX)")
    llm = copy.deepcopy(loaded.llm).bfloat16()
    plain = build_step_graph(llm)
    packed = 0
    for sub in llm.modules():
        if isinstance(sub, torch.nn.Linear) and sub.weight.dim() == 2:
            blocked = torch.ops.mkldnn._reorder_linear_weight(sub.weight.detach(), PACKED_ROWS_HINT)
            sub.weight = torch.nn.Parameter(blocked, requires_grad=False)
            packed += 1
    assert packed > 0
    graph = build_step_graph(llm)
    assert [t.raw_data for t in graph.graph.initializer] == [
        t.raw_data for t in plain.graph.initializer
    ]


@torch.inference_mode()
def test_a_bf16_model_builds_the_graph_from_its_packed_weights(
    tiny_model_dir: Path, loaded: LoadedModel, ort_llm: OrtSpeechLM, tmp_path: Path
) -> None:
    """A bf16 worker's LLM (fused, and packed in oneDNN's layout where the CPU has bf16 dot
    products) builds the same step: its log-probs track the fp32-built graph's."""
    bf16 = load_model(tiny_model_dir, dtype=torch.bfloat16, hash_cache_dir=tmp_path / "h").llm
    digest = loaded.checkpoint_hash
    built = load_ort_llm(bf16, cache_dir=tmp_path, checkpoint_hash=digest, threads=1)
    prefix = prefix_of(loaded.llm)
    backbone = loaded.llm.config.backbone
    expected = ort_llm.step_logp(prefix, KVCache(backbone, 128))
    got = built.step_logp(prefix, KVCache(backbone, 128))
    assert snr_db(expected, got) >= MIN_SNR_DB
