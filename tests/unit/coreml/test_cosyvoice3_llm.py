"""CosyVoice 3's LLM converts as CosyVoice 2's does (the same stateful prefill + decode
package over the shared Qwen2 body), with its own head: 6761 outputs, no bias, and SOS/TASK_ID
taken from `speech_embedding` by the runtime (there is no `llm_embedding`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.doubles.mil_interpreter import MILPredictor
from workers.coreml.convert.llm_convert import convert_llm
from workers.coreml.convert.options import ConvertOptions
from workers.coreml.llm_runtime import CoreMLQwen2LM, embeddings_only
from workers.coreml.stages import LLM_DECODE, LLM_PREFILL
from workers.model.checkpoint import read_state_dict
from workers.model.llm.model import build_llm
from workers.tools.reference.configs import cosyvoice3_llm_config_from_reference
from workers.tools.reference.llm import LOGITS_TOLERANCE, step_logps
from workers.tools.reference.parity import ReferenceSet

CAPACITY = 64


def test_the_converted_cosyvoice3_llm_reproduces_the_reference_steps(
    reference3_dir: Path, tmp_path: Path
) -> None:
    """The fp32 program, states and all, run by the MIL interpreter: the official log-probs
    of a prefill and the stored sampled tokens fed one at a time."""
    ref = ReferenceSet(reference3_dir)
    config = cosyvoice3_llm_config_from_reference(ref.config, "tiny")
    state = read_state_dict(ref.checkpoint("llm"))
    llm = build_llm(config, state, source=ref.checkpoint("llm"), kernel="torch")
    path = tmp_path / "llm.mlpackage"
    convert_llm(llm, ConvertOptions(precision="fp32", target="macOS15"), path, capacity=CAPACITY)
    model: Any = CoreMLQwen2LM(
        config,
        embeddings_only(config, state),
        MILPredictor(path, LLM_PREFILL),
        MILPredictor(path, LLM_DECODE),
        capacity=CAPACITY,
    )
    arrays = ref.arrays("llm_reference.npz")
    with torch.inference_mode():
        logp = step_logps(model, arrays)
    assert logp.shape == arrays["infer_step_logp"].shape == (10, 6761)
    assert float(np.abs(logp.numpy() - arrays["infer_step_logp"]).max()) <= LOGITS_TOLERANCE
