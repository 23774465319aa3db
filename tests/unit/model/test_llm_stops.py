"""How a piece's decoding ended, as both decoders report it, on forced token sequences: the
decoder's weights are zeroed and its bias makes one id certain, so the sequence is known."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from workers.engine.quality import tail_repetition
from workers.model.llm.batch import BatchDecoder, FinishedRow
from workers.model.llm.model import DecodeOutcome, LLMConfig, Qwen2LM, iter_speech_tokens
from workers.model.llm.qwen2 import Qwen2Config
from workers.model.llm.sampling import SamplingConfig
from workers.tools.bench.llm_stage import build_random_llm

QWEN = {
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 48,
    "vocab_size": 100,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 512,
    "hidden_act": "silu",
}
SPEECH = 40
TEXT = [3, 4, 5]  # bounds: 2x-20x the text tokens, 6-60
LOOP_TOKEN = 7


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def scripted(certain: int) -> Qwen2LM:
    """An LLM whose every step makes `certain` (or, before the minimum length where stop ids
    are masked, any other id) the sample."""
    config = LLMConfig(
        backbone=Qwen2Config.from_hf_config(QWEN, source="test"),
        speech_token_size=SPEECH,
        sampling=SamplingConfig(),
    )
    lm = build_random_llm(config, seed=1)
    with torch.no_grad():
        lm.llm_decoder.weight.zero_()
        lm.llm_decoder.bias.fill_(-50.0)
        lm.llm_decoder.bias[certain] = 50.0
    return lm


def alone(model: Qwen2LM, forced: int | None = None) -> tuple[list[int], str]:
    outcome = DecodeOutcome()
    tokens = iter_speech_tokens(
        model,
        TEXT,
        generator=torch.Generator().manual_seed(0),
        forced_length=forced,
        outcome=outcome,
    )
    return list(tokens), outcome.stop


def batched(model: Qwen2LM, forced: int | None = None) -> FinishedRow:
    decoder = BatchDecoder(model, 2, 256)
    decoder.add(
        "k",
        TEXT,
        prompt_text=[],
        prompt_speech=[],
        generator=torch.Generator().manual_seed(0),
        forced_length=forced,
    )
    for _ in range(100):
        finished = decoder.step()
        if finished:
            return finished[0]
    raise AssertionError("the row never finished")


def test_a_sampled_stop_token_is_reported_as_such_by_both_decoders() -> None:
    model = scripted(SPEECH)  # EOS certain once it is no longer masked
    tokens, stop = alone(model)
    assert (len(tokens), stop) == (6, "stop_token")
    row = batched(model)
    assert (len(row.tokens), row.stop) == (6, "stop_token")


def test_a_runaway_to_the_length_bound_is_reported_with_its_loop() -> None:
    model = scripted(LOOP_TOKEN)  # never a stop id: babble until 20x the text
    tokens, stop = alone(model)
    assert (len(tokens), stop) == (60, "length_bound")
    assert set(tokens) == {LOOP_TOKEN} and tail_repetition(tokens) == 1.0
    row = batched(model)
    assert (row.tokens, row.stop) == (tokens, "length_bound")


def test_a_forced_length_is_neither_a_stop_nor_a_runaway() -> None:
    model = scripted(SPEECH)
    tokens, stop = alone(model, forced=9)
    assert (len(tokens), stop) == (9, "forced")
    row = batched(model, forced=9)
    assert (len(row.tokens), row.stop) == (9, "forced")
    row = batched(model, forced=0)
    assert (row.tokens, row.stop) == ([], "forced")


def test_tail_repetition_tells_a_loop_from_varied_tokens() -> None:
    generator = torch.Generator().manual_seed(3)
    varied = torch.randint(0, 6561, (200,), generator=generator).tolist()
    assert tail_repetition(varied) < 0.1
    loop = varied[:100] + [11, 12, 13, 14] * 25  # a 4-token loop for the last 4 s
    assert tail_repetition(loop) == 1.0
    assert tail_repetition([1, 2, 3]) == 0.0  # too short to judge
