"""LLM generation: seeding, length bounds, stop ids, RAS sampling, KV cache, configs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.errors import InvalidRequestError, ModelLoadError
from workers.model.cpu_linear import default_linear_kernel, set_linear_kernel
from workers.model.llm.model import (
    LLMConfig,
    Qwen2LM,
    iter_speech_tokens,
)
from workers.model.llm.qwen2 import KVCache, Qwen2Config
from workers.model.llm.sampling import (
    SamplingConfig,
    nucleus_size,
    ras_sampling,
    top_candidates,
)
from workers.model.yaml_plain import load_plain_yaml
from workers.tools.bench.llm_stage import bench_llm, format_table
from workers.tools.fixtures.random_weights import build_random_llm, family_llm_config

QWEN = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 48,
    "vocab_size": 100,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 512,
    "hidden_act": "silu",
}
SPEECH = 40  # speech tokens 0..39, EOS 40, 41, FILL 42


def small_config(**sampling: float) -> LLMConfig:
    return LLMConfig(
        backbone=Qwen2Config.from_hf_config(QWEN, source="test"),
        speech_token_size=SPEECH,
        sampling=SamplingConfig(**sampling),
    )


@pytest.fixture(scope="module")
def model() -> Qwen2LM:
    return build_random_llm(small_config(), seed=3)


def with_stop_bias(model: Qwen2LM, biases: dict[int, float]) -> Qwen2LM:
    biased = build_random_llm(model.config, seed=3)
    with torch.no_grad():
        for token, bias in biases.items():
            biased.llm_decoder.bias[token] = bias
    return biased


def generate(model: Qwen2LM, seed: int, text: int = 3, **kw) -> list[int]:
    return list(
        iter_speech_tokens(
            model,
            list(range(1, text + 1)),
            prompt_text=[7, 8],
            prompt_speech=[5, 6, 7],
            generator=torch.Generator().manual_seed(seed),
            **kw,
        )
    )


def test_same_seed_same_tokens_different_seed_different(model: Qwen2LM) -> None:
    first = generate(model, 11)
    assert first == generate(model, 11)
    assert first != generate(model, 12)
    assert all(0 <= t < SPEECH for t in first)


def test_eos_is_masked_until_min_length_then_ends(model: Qwen2LM) -> None:
    # EOS wins whenever allowed; the other stop ids are made impossible
    eager = with_stop_bias(model, {SPEECH: 100.0, SPEECH + 1: -100.0, SPEECH + 2: -100.0})
    for seed in range(3):
        assert len(generate(eager, seed, text=3)) == 6  # min = 2 x 3 text tokens


@pytest.mark.parametrize("stop", [SPEECH + 1, SPEECH + 2])
def test_every_stop_id_is_masked_before_min_length(model: Qwen2LM, stop: int) -> None:
    # upstream masks EOS alone: a fill token sampled first gave a piece with no speech (an
    # empty result the encoder refused as `internal`)
    eager = with_stop_bias(model, {stop: 100.0})
    for seed in range(3):
        assert len(generate(eager, seed, text=3)) == 6


def test_generation_stops_at_max_length(model: Qwen2LM) -> None:
    never = with_stop_bias(model, {SPEECH: -100.0, SPEECH + 1: -100.0, SPEECH + 2: -100.0})
    assert len(generate(never, 0, text=2)) == 40  # max = 20 x 2 text tokens


def test_prompt_text_does_not_count_towards_length_bounds(model: Qwen2LM) -> None:
    never = with_stop_bias(model, {SPEECH: -100.0, SPEECH + 1: -100.0, SPEECH + 2: -100.0})
    tokens = list(
        iter_speech_tokens(
            never, [1], prompt_text=list(range(10)), generator=torch.Generator().manual_seed(0)
        )
    )
    assert len(tokens) == 20


def test_forced_length_masks_every_stop_id(model: Qwen2LM) -> None:
    eager = with_stop_bias(model, {SPEECH: 100.0, SPEECH + 1: 100.0, SPEECH + 2: 100.0})
    tokens = generate(eager, 0, forced_length=75)  # beyond the natural max of 60
    assert len(tokens) == 75
    assert all(t < SPEECH for t in tokens)


def test_bad_requests_are_rejected_up_front(model: Qwen2LM) -> None:
    g = torch.Generator()
    with pytest.raises(InvalidRequestError, match="text: needs at least one token"):
        iter_speech_tokens(model, [], generator=g)
    with pytest.raises(InvalidRequestError, match=r"prompt_speech: token ids must be in \[0, 40\)"):
        iter_speech_tokens(model, [1], prompt_speech=[SPEECH], generator=g)
    with pytest.raises(InvalidRequestError, match="text: token ids"):
        iter_speech_tokens(model, [100], generator=g)
    with pytest.raises(InvalidRequestError, match="shape"):
        iter_speech_tokens(model, [[1, 2], [3, 4]], generator=g)


def test_kv_cache_chunks_equal_one_causal_pass(model: Qwen2LM) -> None:
    """Explicit masking: chunked prefill (offset causal) and single steps match no cache."""
    x = torch.randn(1, 9, 32, generator=torch.Generator().manual_seed(0))
    backbone = model.backbone
    with torch.inference_mode():
        full = backbone(x, None)
        cache = KVCache(model.config.backbone, 9)
        parts = [backbone(x[:, :4], cache), backbone(x[:, 4:7], cache)]
        parts += [backbone(x[:, 7:8], cache), backbone(x[:, 8:9], cache)]
    torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=1e-5, rtol=0)
    assert cache.length == 9


def test_kv_cache_refuses_to_overflow(model: Qwen2LM) -> None:
    cache = KVCache(model.config.backbone, 4)
    with torch.inference_mode(), pytest.raises(InvalidRequestError, match="capacity 4"):
        model.backbone(torch.zeros(1, 5, 32), cache)
    with pytest.raises(InvalidRequestError, match="max_position_embeddings 512"):
        KVCache(model.config.backbone, 513)


def test_teacher_forcing_without_prompt_speech(model: Qwen2LM) -> None:
    lm_input, _, logits = model.teacher_forced([1, 2], [], [], [3, 4, 5])
    assert lm_input.shape == (1, 1 + 2 + 1 + 3, 32)
    assert logits.shape == (1, 7, SPEECH + 3)
    assert torch.equal(lm_input[0, 0], model.llm_embedding.weight[0])
    assert torch.equal(lm_input[0, 3], model.llm_embedding.weight[1])


def test_bf16_weights_track_fp32(model: Qwen2LM) -> None:
    half = build_random_llm(model.config, seed=3, dtype=torch.bfloat16)
    args = ([1, 2, 3], [4], [5, 6], [7, 8])
    ref = model.teacher_forced(*args)[2]
    low = half.teacher_forced(*args)[2].float()
    assert (low - ref).abs().max() < 0.05 * ref.abs().max() + 1e-3
    assert generate(half, 0)  # the sampler accepts bf16 logits


# --- sampling ---


def test_nucleus_keeps_candidates_until_top_p_is_reached() -> None:
    probs = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
    assert nucleus_size(probs, 0.8, 25) == 3  # sums before: 0, .5, .7 < .8; .85 stops
    assert nucleus_size(probs, 0.8, 2) == 2
    assert nucleus_size(probs, 0.3, 25) == 1
    assert nucleus_size(probs, 1.0, 25) == 5


@settings(max_examples=300, deadline=None)
@given(
    levels=st.lists(st.integers(0, 6), min_size=1, max_size=300),
    k=st.integers(1, 40),
)
def test_top_candidates_are_the_stable_sorts_first_k(levels: list[int], k: int) -> None:
    """Few distinct values, so ties sit across the k-th place: ids in the stable sort's order."""
    probs = torch.tensor(levels, dtype=torch.float32).softmax(dim=0)
    values, ids = top_candidates(probs, k)
    expected_values, expected_ids = probs.sort(descending=True, stable=True)
    assert torch.equal(ids, expected_ids[:k]) and torch.equal(values, expected_values[:k])


def test_top_candidates_of_scores_that_are_not_finite_fall_back_to_the_sort() -> None:
    probs = torch.tensor([0.1, float("nan"), 0.3, 0.3])
    values, ids = top_candidates(probs, 2)
    expected_values, expected_ids = probs.sort(descending=True, stable=True)
    assert torch.equal(ids, expected_ids[:2])
    assert torch.equal(values.isnan(), expected_values[:2].isnan())


def test_sampling_stays_inside_the_nucleus() -> None:
    logp = torch.tensor([0.6, 0.25, 0.1, 0.05]).log()
    config = SamplingConfig(top_p=0.8, top_k=25)
    drawn = {ras_sampling(logp, [], config, torch.Generator().manual_seed(s)) for s in range(200)}
    assert drawn == {0, 1}


def test_repeated_id_is_redrawn_from_the_full_softmax() -> None:
    """Top-p keeps only id 0 (p 0.9); if 0 is in the last 10 outputs, redraw over all ids."""
    logp = torch.tensor([0.9, 0.05, 0.03, 0.02]).log()
    config = SamplingConfig()

    def draws(decoded: list[int]) -> list[int]:
        return [
            ras_sampling(logp, decoded, config, torch.Generator().manual_seed(s))
            for s in range(400)
        ]

    assert set(draws([1] * 20)) == {0}
    assert set(draws([0] + [1] * 10)) == {0}  # 0 fell out of the 10-token window
    redrawn = draws([1] * 9 + [0])
    others = sum(t != 0 for t in redrawn) / len(redrawn)
    assert 0.04 < others < 0.2  # ~0.1 of the full softmax is not id 0
    assert set(redrawn) - {0}


def test_sampling_config_from_yaml_and_qwen_config(tmp_path: Path) -> None:
    path = tmp_path / "cosyvoice2.yaml"
    path.write_text(
        "llm_input_size: 32\nllm_output_size: 32\n"
        "llm: !new:cosyvoice.llm.llm.Qwen2LM\n"
        "    llm_input_size: !ref <llm_input_size>\n"
        "    llm_output_size: !ref <llm_output_size>\n"
        "    speech_token_size: 40\n"
        "    sampling: !name:cosyvoice.utils.common.ras_sampling\n"
        "        top_p: 0.7\n        top_k: 5\n        win_size: 8\n        tau_r: 0.2\n"
    )
    config = LLMConfig.from_model_yaml(load_plain_yaml(path), QWEN)
    assert config.sampling == SamplingConfig(top_p=0.7, top_k=5, win_size=8, tau_r=0.2)
    assert config.stop_tokens == (40, 41, 42)
    assert config.backbone.head_dim == 8
    assert config.sampling.length_bounds(7) == (14, 140)


@pytest.mark.parametrize(
    ("qwen", "llm", "message"),
    [
        ({k: v for k, v in QWEN.items() if k != "rope_theta"}, {}, "missing key 'rope_theta'"),
        (dict(QWEN, num_key_value_heads=3), {}, "num_key_value_heads 3"),
        (QWEN, {"llm_input_size": 64}, "must equal the Qwen2 hidden_size 32"),
        (QWEN, {"sampling": {"top_p": 0.8}}, "sampling is missing key 'top_k'"),
        (QWEN, {"sampling": dict(top_p=2.0, top_k=25, win_size=10, tau_r=0.1)}, "top_p"),
    ],
)
def test_bad_configs_name_the_problem(qwen: dict, llm: dict, message: str) -> None:
    doc = {
        "llm": {
            "llm_input_size": 32,
            "llm_output_size": 32,
            "speech_token_size": 40,
            "sampling": dict(top_p=0.8, top_k=25, win_size=10, tau_r=0.1),
            **llm,
        }
    }
    with pytest.raises(ModelLoadError, match=message):
        LLMConfig.from_model_yaml(doc, qwen)


def test_bench_functions_run_on_a_small_config() -> None:
    result = bench_llm(
        config=small_config(), threads=1, prefill_positions=12, decode_tokens=4, runs=1
    )
    assert result.decode_tokens == 4 and result.prefill_s > 0 and result.ms_per_token > 0
    assert "per token" in format_table(result)
    small = small_config()  # CosyVoice 3's variant needs its <|endofprompt|> (here a small id)
    cosyvoice3 = dataclasses.replace(
        family_llm_config(small, "cosyvoice3"), required_text_token=small.backbone.vocab_size - 1
    )
    result = bench_llm(config=cosyvoice3, threads=1, prefill_positions=12, decode_tokens=4, runs=1)
    assert result.decode_tokens == 4 and result.ms_per_token > 0


def test_linear_kernel_choice() -> None:
    assert default_linear_kernel(torch.device("meta"), torch.float32) == "torch"
    assert default_linear_kernel(torch.device("cpu"), torch.float16) == "torch"
    with pytest.raises(ValueError, match="linear kernel must be one of"):
        set_linear_kernel(torch.nn.Linear(2, 2), "fast")
