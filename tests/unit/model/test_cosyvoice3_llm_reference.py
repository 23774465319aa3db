"""Parity of CosyVoice 3's LLM with the official arrays, its input rule and its silent cap."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from shared.errors import InvalidRequestError
from workers.model.llm.cosyvoice3 import END_OF_PROMPT, cap_silent_runs
from workers.model.llm.model import Qwen2LM, iter_speech_tokens
from workers.tools.reference.cosyvoice3_llm import (
    compare_cosyvoice3_llm,
    cosyvoice3_llm_key_differences,
    load_reference_cosyvoice3_llm,
)
from workers.tools.reference.parity import ArrayCheck, ReferenceSet

INPUTS = {"prompt_text", "text", "prompt_speech_token", "target_speech_token", "embedding"}
INPUTS |= {"n_infer", "infer_seed", "xl_text", "instruct_text", "early_stop_seed"}
INPUTS |= {"stop_demo_a_script", "stop_demo_b_script", "silent_demo_in"}


@pytest.fixture(scope="module")
def ref(reference3_dir: Path) -> ReferenceSet:
    return ReferenceSet(reference3_dir)


@pytest.fixture(scope="module")
def llm(ref: ReferenceSet) -> Qwen2LM:
    return load_reference_cosyvoice3_llm(ref)


@pytest.fixture(scope="module")
def checks(ref: ReferenceSet, llm: Qwen2LM) -> list[ArrayCheck]:
    return compare_cosyvoice3_llm(llm, ref)


def test_every_llm_array_is_checked_and_passes(ref: ReferenceSet, checks: list[ArrayCheck]) -> None:
    stored = set(ref.arrays("llm_reference.npz")) - INPUTS
    assert {c.name for c in checks} == {f"llm_reference:{n}" for n in stored}
    assert [c for c in checks if not c.passed] == []
    assert all(c.tolerance <= 1e-4 for c in checks)


@pytest.mark.parametrize(
    ("size", "listing"), [("tiny", "keys-llm-tiny.txt"), ("full", "keys-llm.txt")]
)
def test_keys_equal_the_listings(ref: ReferenceSet, size: str, listing: str) -> None:
    assert cosyvoice3_llm_key_differences(ref, size, listing) == []


def test_layout_uses_speech_embedding_rows_and_stops_on_all_200(llm: Qwen2LM) -> None:
    config = llm.config
    assert not hasattr(llm, "llm_embedding")
    assert llm.llm_decoder.bias is None
    assert config.stop_tokens == tuple(range(6561, 6761))
    assert config.eos_token == 6562
    assert config.masked_below_min_length == [6561]
    prefix = llm.prefix_embeddings(
        torch.tensor([END_OF_PROMPT]),
        torch.tensor([], dtype=torch.long),
        torch.tensor([], dtype=torch.long),
    )
    assert torch.equal(prefix[0, 0], llm.speech_embedding.weight[6561])
    assert torch.equal(prefix[0, -1], llm.speech_embedding.weight[6563])


def test_text_without_endofprompt_is_refused_by_name(llm: Qwen2LM) -> None:
    with pytest.raises(InvalidRequestError, match="endofprompt"):
        iter_speech_tokens(llm, [5, 6, 7], prompt_text=[8], generator=torch.Generator())


def test_silent_runs_are_capped_after_five_and_reset_by_speech(llm: Qwen2LM) -> None:
    tokens = [1] * 7 + [100] + [2] * 6
    assert list(cap_silent_runs(tokens, llm.config)) == [1] * 5 + [100] + [2] * 5
