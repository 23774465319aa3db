"""Parity of CosyVoice 3's LLM (`Qwen2LM` with `cosyvoice3_variant`) with `llm_reference.npz`.

On top of CosyVoice 2's checks (teacher forcing, the KV-cache steps on the stored tokens, the
length bounds, the seeded first tokens): the seeded run to its own end and the seeded run that
stops at once (both decide on upstream's min-length rule), the first step of the cross-lingual
and instruct layouts, the two scripted stop demos (no RNG) and the silent-run cap.
"""

from __future__ import annotations

import numpy as np
import torch

from workers.model.checkpoint import read_state_dict
from workers.model.llm.cosyvoice3 import cap_silent_runs
from workers.model.llm.model import DecodeOutcome, Qwen2LM, build_llm, iter_speech_tokens
from workers.model.llm.qwen2 import KVCache
from workers.tools.reference.configs import cosyvoice3_llm_config_from_reference
from workers.tools.reference.llm import LOGITS_TOLERANCE, llm_checks
from workers.tools.reference.parity import (
    ArrayCheck,
    ReferenceSet,
    compare,
    describe_state,
    key_list_differences,
    read_key_list,
)

ARRAYS = "llm_reference.npz"
CPU = torch.device("cpu")


def _name(array: str) -> str:
    return f"llm_reference:{array}"


def _ids(arrays: dict[str, np.ndarray], key: str | None) -> torch.Tensor:
    if key is None:
        return torch.zeros(0, dtype=torch.int64)
    return torch.from_numpy(arrays[key].astype(np.int64)).reshape(-1)


def load_reference_cosyvoice3_llm(ref: ReferenceSet, device: torch.device = CPU) -> Qwen2LM:
    """The set's tiny CosyVoice 3 LLM, strictly loaded from llm.pt."""
    config = cosyvoice3_llm_config_from_reference(ref.config, "tiny")
    path = ref.checkpoint("llm")
    return build_llm(config, read_state_dict(path), source=path, device=device)


def check_cosyvoice3_llm(ref: ReferenceSet, device: torch.device = CPU) -> list[ArrayCheck]:
    """One check per array of the CosyVoice 3 LLM reference."""
    return compare_cosyvoice3_llm(load_reference_cosyvoice3_llm(ref, device), ref)


def compare_cosyvoice3_llm(model: Qwen2LM, ref: ReferenceSet) -> list[ArrayCheck]:
    arrays = ref.arrays(ARRAYS)
    checks = llm_checks(model, arrays)
    checks += _seeded_runs(model, arrays)
    checks += _first_steps(model, arrays)
    checks += [c for demo in ("a", "b") for c in _stop_demo(model, arrays, demo)]
    capped = list(cap_silent_runs(arrays["silent_demo_in"].tolist(), model.config))
    checks.append(compare(_name("silent_demo_out"), np.array(capped), arrays["silent_demo_out"], 0))
    silent = np.array(model.config.silent_tokens)
    return [*checks, compare(_name("silent_tokens"), silent, arrays["silent_tokens"], 0.0)]


def _seeded_runs(model: Qwen2LM, arrays: dict[str, np.ndarray]) -> list[ArrayCheck]:
    """The official loop seeded with `infer_seed` and `early_stop_seed`, each to its own end."""
    checks = []
    for seed_key, prefix in (("infer_seed", "infer_all"), ("early_stop_seed", "early_stop")):
        outcome = DecodeOutcome()
        yielded = list(
            iter_speech_tokens(
                model,
                _ids(arrays, "text"),
                prompt_text=_ids(arrays, "prompt_text"),
                prompt_speech=_ids(arrays, "prompt_speech_token"),
                generator=torch.Generator().manual_seed(int(arrays[seed_key])),
                outcome=outcome,
            )
        )
        drawn = [*yielded, -1 if outcome.stop_token is None else outcome.stop_token]
        checks += [
            compare(_name(f"{prefix}_yielded"), np.array(yielded), arrays[f"{prefix}_yielded"], 0),
            compare(_name(f"{prefix}_drawn"), np.array(drawn), arrays[f"{prefix}_drawn"], 0.0),
        ]
    return checks


@torch.inference_mode()
def _logps(
    model: Qwen2LM, arrays: dict[str, np.ndarray], layout: tuple[str | None, ...], fed: list[int]
) -> torch.Tensor:
    """Prefill `layout` (text, prompt_text, prompt_speech keys), feed `fed` -> (1+len, V)."""
    prefix = model.prefix_embeddings(*(_ids(arrays, key).to(model.device) for key in layout))
    cache = KVCache(model.config.backbone, prefix.shape[1] + len(fed) + 1, device=model.device)
    rows = [model.step_logp(prefix, cache)]
    for token in fed:
        rows.append(model.step_logp(model.speech_embedding.weight[token].view(1, 1, -1), cache))
    return torch.stack(rows)


ZERO_SHOT = ("text", "prompt_text", "prompt_speech_token")


def _first_steps(model: Qwen2LM, arrays: dict[str, np.ndarray]) -> list[ArrayCheck]:
    layouts = {
        "early_stop_first_logp": ZERO_SHOT,
        "xl_first_logp": ("xl_text", None, None),
        "instruct_first_logp": ("text", "instruct_text", None),
    }
    return [
        compare(_name(name), _logps(model, arrays, layout, []), arrays[name], LOGITS_TOLERANCE)
        for name, layout in layouts.items()
    ]


def _stop_demo(model: Qwen2LM, arrays: dict[str, np.ndarray], demo: str) -> list[ArrayCheck]:
    """The official loop with a scripted sampler: yield until a scripted stop id."""
    script = arrays[f"stop_demo_{demo}_script"].tolist()
    steps = next(i for i, t in enumerate(script) if t in model.config.stop_tokens) + 1
    yielded = script[: steps - 1]
    min_len, _ = model.config.sampling.length_bounds(arrays["text"].size)
    name = f"stop_demo_{demo}"
    return [
        compare(_name(f"{name}_yielded"), np.array(yielded), arrays[f"{name}_yielded"], 0.0),
        compare(
            _name(f"{name}_logp"),
            _logps(model, arrays, ZERO_SHOT, yielded),
            arrays[f"{name}_logp"],
            LOGITS_TOLERANCE,
        ),
        compare(
            _name(f"{name}_ignore_eos"),
            np.arange(steps) < min_len,
            arrays[f"{name}_ignore_eos"],
            0.0,
        ),
    ]


def cosyvoice3_llm_key_differences(ref: ReferenceSet, size: str, listing: str) -> list[str]:
    """Our state dict (built on meta) against a key listing of the set; [] = equal."""
    config = cosyvoice3_llm_config_from_reference(ref.config, size)
    with torch.device("meta"):
        model = Qwen2LM(config)
    return key_list_differences(
        describe_state(model.state_dict()), read_key_list(ref.root / listing), listing
    )
