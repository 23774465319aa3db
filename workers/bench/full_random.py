"""A model directory with the FULL CosyVoice2-0.5B architecture and random weights (benchmarks).

Real weights are not available here, yet speed and memory must be measured at full size and
through the real loading path. `write_random_model(root)` writes the official layout: the
upstream-format yaml and Qwen2 config at FULL sizes, checkpoints of the right keys and shapes
(2.0 GB llm.pt, 0.45 GB flow.pt, 83 MB hift.pt) with cheap well-scaled random values
(N(0, 0.02) weights, zero biases, unit norms: the stage benches' own builders), and the tiny
model's tokenizer, ONNX stand-ins and prompt (small files of the real formats; their ids fit the
full vocabularies). Benchmarks force the token count with stop ids masked, since random
weights never stop on their own. `python -m workers.bench.full_random DIR` runs it in a fresh
process, so the benchmark's own memory peak is not the writer's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import torch

from workers.model.bench_flow import random_state_dict
from workers.model.bench_llm import build_random_llm
from workers.model.directory import ModelDirectory, checkpoint_hashes
from workers.model.hift import HiFTGenerator
from workers.model.loader import ModelConfigs
from workers.model.tiny import F0_CLASSIFIER_BIAS, F0_CLASSIFIER_SCALE, write_model_files
from workers.model.tiny_config import TinySpec

# CosyVoice2-0.5B's sizes (the reference set's config.json "full" section).
FULL_SPEC = TinySpec(
    llm_hidden=896,
    llm_layers=24,
    llm_heads=14,
    llm_kv_heads=2,
    llm_intermediate=4864,
    text_vocab=151936,
    flow_width=512,
    encoder_heads=8,
    encoder_linear_units=2048,
    encoder_blocks=6,
    estimator_channels=256,
    estimator_head_dim=64,
    estimator_heads=8,
    estimator_blocks=4,
    estimator_mid_blocks=12,
    hift_base_channels=512,
    hift_cond_channels=512,
)
MARKER = "cosyq-random-model.json"  # what was written; a matching marker means "reuse"
INIT_STD = 0.02


def _marker(spec: TinySpec, seed: int) -> dict[str, object]:
    return {"spec": spec.__dict__, "seed": seed, "format": 1}


def is_written(root: Path, spec: TinySpec = FULL_SPEC, seed: int = 0) -> bool:
    path = root / MARKER
    if not path.is_file():
        return False
    try:
        return bool(json.loads(path.read_text()) == _marker(spec, seed))
    except ValueError:
        return False


def _random_hift_state(configs: ModelConfigs, seed: int) -> dict[str, torch.Tensor]:
    """HiFT with weight norm unfolded (the official key layout), N(0, 0.02), voiced F0."""
    with torch.device("meta"):
        model = HiFTGenerator(configs.hift)
    model.to_empty(device="cpu")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, INIT_STD, generator=generator)
        classifier = model.f0_predictor.classifier
        classifier.weight.mul_(F0_CLASSIFIER_SCALE)
        if classifier.bias is not None:
            classifier.bias.fill_(F0_CLASSIFIER_BIAS)
    return OrderedDict(model.state_dict())


def _write_checkpoints(directory: ModelDirectory, seed: int) -> None:
    """One stage at a time, so the writer holds at most one stage's weights."""
    configs = ModelConfigs.from_directory(directory)
    llm = build_random_llm(configs.llm, seed=seed)
    torch.save(OrderedDict(llm.state_dict()), directory.checkpoint("llm"))
    del llm
    torch.save(OrderedDict(random_state_dict(configs.flow, seed)), directory.checkpoint("flow"))
    torch.save(_random_hift_state(configs, seed), directory.checkpoint("hift"))


def write_random_model(
    root: Path, *, spec: TinySpec = FULL_SPEC, seed: int = 0, hash_cache_dir: Path | None = None
) -> ModelDirectory:
    """Write (or rewrite) the directory; hashes go to `hash_cache_dir` like a first worker's."""
    root.mkdir(parents=True, exist_ok=True)
    (root / MARKER).unlink(missing_ok=True)
    directory = write_model_files(root, spec, seed)
    _write_checkpoints(directory, seed)
    directory.check_layout()
    checkpoint_hashes(directory, hash_cache_dir)
    (root / MARKER).write_text(json.dumps(_marker(spec, seed)), encoding="utf-8")
    return directory


def ensure_random_model(root: Path, *, seed: int = 0, hash_cache_dir: Path | None = None) -> Path:
    """The FULL random directory at `root`, written by a child process unless already there."""
    if not is_written(root, FULL_SPEC, seed):
        repo = Path(__file__).resolve().parents[2]
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])
        )
        command = [
            sys.executable,
            "-m",
            "workers.bench.full_random",
            str(root),
            "--seed",
            str(seed),
        ]
        if hash_cache_dir is not None:
            command += ["--hash-cache-dir", str(hash_cache_dir)]
        subprocess.run(command, check=True, env=env)
    return root


def main(argv: list[str] | None = None) -> int:
    import argparse  # noqa: PLC0415

    parser = argparse.ArgumentParser(description="write a FULL-size random-weight model")
    parser.add_argument("directory", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--hash-cache-dir", type=Path, default=None)
    args = parser.parse_args(argv)
    write_random_model(args.directory, seed=args.seed, hash_cache_dir=args.hash_cache_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
