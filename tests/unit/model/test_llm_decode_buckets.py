"""bf16 decode steps read keys in whole buckets (`decode_key_span`), the positions past the
cache's end masked: the same log-probs as reading exactly the written keys, even when the
cache's unwritten memory holds NaN (the bucket's tail is zeroed before it is read)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from workers.model.checkpoint import read_state_dict
from workers.model.llm import qwen2
from workers.model.llm.model import Qwen2LM, build_llm
from workers.model.llm.qwen2 import KVCache, decode_key_span
from workers.tools.reference.configs import llm_config_from_reference
from workers.tools.reference.parity import ReferenceSet

STEPS = 90  # crosses two bucket edges after a 40-position prefix


@pytest.fixture(scope="module")
def model(reference_dir: Path) -> Qwen2LM:
    ref = ReferenceSet(reference_dir)
    config = llm_config_from_reference(ref.config, "tiny")
    state = read_state_dict(ref.checkpoint("llm"))
    return build_llm(config, state, source="llm.pt", dtype=torch.bfloat16)


def _decode(model: Qwen2LM, *, poison: bool) -> torch.Tensor:
    """Prefill 40 positions, then STEPS one-token steps -> (STEPS + 1, V) log-probs."""
    ids = torch.Generator().manual_seed(3)
    text = torch.randint(model.config.backbone.vocab_size, (14,), generator=ids)
    prompt_text = torch.randint(model.config.backbone.vocab_size, (8,), generator=ids)
    prompt_speech = torch.randint(model.config.speech_token_size, (16,), generator=ids)
    tokens = torch.randint(model.config.speech_token_size, (STEPS,), generator=ids)
    with torch.inference_mode():
        prefix = model.prefix_embeddings(text, prompt_text, prompt_speech)
        cache = KVCache(model.config.backbone, prefix.shape[1] + STEPS, dtype=torch.bfloat16)
        if poison:  # what uninitialised memory may hold
            cache.keys.fill_(float("nan"))
            cache.values.fill_(float("nan"))
        logps = [model.step_logp(prefix, cache)]
        for token in tokens:
            step = model.speech_embedding(token.view(1, 1))
            logps.append(model.step_logp(step, cache))
    return torch.stack(logps)


def test_bucketed_steps_equal_exact_spans_over_poisoned_memory(
    model: Qwen2LM, monkeypatch: pytest.MonkeyPatch
) -> None:
    bucketed = _decode(model, poison=True)
    monkeypatch.setattr(qwen2, "DECODE_KEY_BUCKET", 1)  # every step reads exactly its keys
    exact = _decode(model, poison=False)
    assert torch.isfinite(bucketed).all()
    torch.testing.assert_close(bucketed, exact, rtol=0, atol=1e-4)


def test_decode_key_span() -> None:
    assert [decode_key_span(end, 1000) for end in (1, 63, 64, 65, 128)] == [64, 64, 64, 128, 128]
    assert decode_key_span(990, 1000) == 1000  # never past the cache
