"""`cosyq-worker model init-tiny`: a complete model directory with small random weights.

The directory has every file of the official `CosyVoice2-0.5B` layout in its official format,
so the loader, the pipeline, the worker and the Core ML converter run on it exactly as on the
real model. Weights are random (the audio is noise-like); two adjustments after init make the
output behave like speech in shape: HiFT's F0 classifier is scaled so most frames are voiced
(as the reference set does), and the LLM's EOS logit is raised so utterances end at a length
that grows with the text instead of always running to the 20x maximum.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path

import numpy as np
import torch
from torch import nn

from workers.model.directory import QWEN_DIR, YAML_FILE, ModelDirectory
from workers.model.flow import CausalMaskedDiffWithXvec
from workers.model.hift import HiFTGenerator
from workers.model.llm import Qwen2LM
from workers.model.loader import ModelConfigs
from workers.model.tiny_assets import (
    write_prompt,
    write_speaker_model,
    write_speech_tokenizer,
    write_tokenizer,
)
from workers.model.tiny_config import TinySpec, qwen2_config, render_yaml
from workers.model.tokenizer import COSYVOICE2_SPECIAL_TOKENS

F0_CLASSIFIER_SCALE = 1000.0  # the reference set's adjustment: f0 from ~0 to ~200 Hz
F0_CLASSIFIER_BIAS = 200.0
EOS_LOGIT_BIAS = 3.0  # added to the EOS logit: stopping becomes likely after the minimum length


def _save_state(module: nn.Module, path: Path) -> None:
    """torch.save a bare OrderedDict state_dict, as the official files are."""
    torch.save(OrderedDict(module.state_dict()), path)


def _adjust(llm: Qwen2LM, hift: HiFTGenerator) -> None:
    with torch.no_grad():
        classifier = hift.f0_predictor.classifier
        classifier.weight.mul_(F0_CLASSIFIER_SCALE)
        if classifier.bias is not None:
            classifier.bias.fill_(F0_CLASSIFIER_BIAS)
        bias = llm.llm_decoder.bias
        if bias is not None:
            bias[llm.config.eos_token] += EOS_LOGIT_BIAS


def _write_checkpoints(directory: ModelDirectory, seed: int) -> None:
    configs = ModelConfigs.from_directory(directory)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        llm = Qwen2LM(configs.llm)
        flow = CausalMaskedDiffWithXvec(configs.flow)
        hift = HiFTGenerator(configs.hift)
    _adjust(llm, hift)
    _save_state(llm, directory.checkpoint("llm"))
    _save_state(flow, directory.checkpoint("flow"))
    _save_state(hift, directory.checkpoint("hift"))


def write_model_files(root: Path, spec: TinySpec, seed: int) -> ModelDirectory:
    """Everything but the checkpoints: yaml, Qwen2 config, tokenizer, ONNX stand-ins, prompt."""
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    (root / YAML_FILE).write_text(render_yaml(spec), encoding="utf-8")
    qwen_dir = root / QWEN_DIR
    qwen_dir.mkdir(exist_ok=True)
    (qwen_dir / "config.json").write_text(
        json.dumps(qwen2_config(spec), indent=2), encoding="utf-8"
    )
    write_tokenizer(qwen_dir, spec.text_vocab, n_special=len(COSYVOICE2_SPECIAL_TOKENS))
    write_speech_tokenizer(root / "speech_tokenizer_v2.onnx", rng, speech_vocab=6561)
    write_speaker_model(root / "campplus.onnx", rng)
    write_prompt(root, rng)
    return ModelDirectory(root)


def write_tiny_model(root: Path, *, seed: int = 0, spec: TinySpec | None = None) -> ModelDirectory:
    """Write the tiny model into `root` (created; existing model files are replaced)."""
    directory = write_model_files(root, spec or TinySpec(), seed)
    _write_checkpoints(directory, seed)
    directory.check_layout()
    return directory
