"""Parity of our LLM stage with the official reference arrays (`llm_reference.npz`).

Teacher forcing checks the input layout, the backbone and the decoder at every position; the
KV-cache path is checked without any RNG by feeding the stored sampled tokens one at a time
and comparing each step's log-probs. Whether our sampler, seeded like upstream, draws the
same tokens is reported too, ungated: it depends on torch's multinomial implementation.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from workers.model.checkpoint import read_state_dict
from workers.model.llm.model import (
    Qwen2LM,
    build_llm,
    iter_speech_tokens,
)
from workers.model.llm.qwen2 import KVCache
from workers.tools.reference.configs import llm_config_from_reference
from workers.tools.reference.parity import (
    ArrayCheck,
    ReferenceSet,
    compare,
    describe_state,
    key_list_differences,
    read_key_list,
)

ARRAYS = "llm_reference.npz"
LOGITS_TOLERANCE = 1e-4  # reference README: float32 re-implementation of logits / log-probs
KEYS_FILE = "keys-llm.txt"


def load_reference_llm(
    ref: ReferenceSet, device: torch.device, kernel: str | None = None
) -> Qwen2LM:
    """The tiny reference LLM, strictly loaded from the set's llm.pt."""
    config = llm_config_from_reference(ref.config, "tiny")
    path = ref.checkpoint("llm")
    return build_llm(config, read_state_dict(path), source=path, device=device, kernel=kernel)


def check_llm(
    ref: ReferenceSet, device: torch.device | None = None, kernel: str | None = None
) -> list[ArrayCheck]:
    """One check per reference array (see module docstring), names "llm_reference:<array>"."""
    model = load_reference_llm(ref, device or torch.device("cpu"), kernel)
    return llm_checks(model, ref.arrays(ARRAYS))


def llm_checks(model: Qwen2LM, arrays: dict[str, np.ndarray]) -> list[ArrayCheck]:
    """The checks of `check_llm` for any model and `llm_reference.npz`-style arrays."""
    return _teacher_forced_checks(model, arrays) + _incremental_checks(model, arrays)


def _name(array: str) -> str:
    return f"{ARRAYS.removesuffix('.npz')}:{array}"


def _ids(arrays: dict[str, np.ndarray], key: str) -> torch.Tensor:
    return torch.from_numpy(arrays[key].astype(np.int64)).reshape(-1)


def _teacher_forced_checks(model: Qwen2LM, arrays: dict[str, np.ndarray]) -> list[ArrayCheck]:
    lm_input, hidden, logits = model.teacher_forced(
        _ids(arrays, "text"),
        _ids(arrays, "prompt_text"),
        _ids(arrays, "prompt_speech_token"),
        _ids(arrays, "target_speech_token"),
    )
    prefix_len = lm_input.shape[1] - arrays["target_speech_token"].size
    tol = LOGITS_TOLERANCE
    return [
        compare(_name("prefix_len"), np.array(prefix_len), arrays["prefix_len"], 0.0),
        compare(_name("lm_input"), lm_input, arrays["lm_input"], tol),
        compare(_name("hidden"), hidden, arrays["hidden"], tol),
        compare(_name("logits"), logits, arrays["logits"], tol),
        compare(_name("target_logits"), logits[:, prefix_len - 1 :], arrays["target_logits"], tol),
    ]


@torch.inference_mode()
def step_logps(model: Qwen2LM, arrays: dict[str, np.ndarray]) -> torch.Tensor:
    """Prefill the prompt, then feed the stored sampled tokens one at a time -> (steps, V)."""
    tokens = arrays["infer_sampled_tokens"].reshape(-1).tolist()
    device = model.device
    prefix = model.prefix_embeddings(
        _ids(arrays, "text").to(device),
        _ids(arrays, "prompt_text").to(device),
        _ids(arrays, "prompt_speech_token").to(device),
    )
    cache = KVCache(model.config.backbone, prefix.shape[1] + len(tokens), device=device)
    rows = [model.step_logp(prefix, cache)]
    for token in tokens[:-1]:
        rows.append(model.step_logp(model.speech_embedding.weight[token].view(1, 1, -1), cache))
    return torch.stack(rows)


def _incremental_checks(model: Qwen2LM, arrays: dict[str, np.ndarray]) -> list[ArrayCheck]:
    text_tokens = arrays["text"].size
    min_len, max_len = model.config.sampling.length_bounds(text_tokens)
    steps = arrays["infer_step_logp"].shape[0]
    ignore_eos = np.arange(steps) < min_len
    checks = [
        compare(
            _name("infer_step_logp"),
            step_logps(model, arrays),
            arrays["infer_step_logp"],
            LOGITS_TOLERANCE,
        ),
        compare(_name("infer_min_len"), np.array(min_len), arrays["infer_min_len"], 0.0),
        compare(_name("infer_max_len"), np.array(max_len), arrays["infer_max_len"], 0.0),
        compare(_name("infer_ignore_eos"), ignore_eos, arrays["infer_ignore_eos"], 0.0),
    ]
    return [*checks, _sampled_tokens_check(model, arrays)]


def _sampled_tokens_check(model: Qwen2LM, arrays: dict[str, np.ndarray]) -> ArrayCheck:
    expected = arrays["infer_sampled_tokens"].reshape(-1)
    generator = torch.Generator().manual_seed(int(arrays["infer_seed"]))
    tokens = iter_speech_tokens(
        model,
        _ids(arrays, "text"),
        prompt_text=_ids(arrays, "prompt_text"),
        prompt_speech=_ids(arrays, "prompt_speech_token"),
        generator=generator,
    )
    stream = list(itertools.islice(tokens, expected.size))  # upstream stopped after 10
    ours = np.array(stream + [-1] * (expected.size - len(stream)))
    return compare(
        _name("infer_sampled_tokens"),
        ours,
        expected,
        0.0,
        gated=False,
        detail="seeded like upstream; depends on torch's multinomial, so informational",
    )


def check_llm_full_keys(ref: ReferenceSet) -> list[str]:
    """FULL config built on meta vs keys-llm.txt (keys, order, shapes, dtypes); [] = equal."""
    config = llm_config_from_reference(ref.config, "full")
    with torch.device("meta"):
        model = Qwen2LM(config)
    return key_list_differences(
        describe_state(model.state_dict()), read_key_list(ref.root / KEYS_FILE), KEYS_FILE
    )
