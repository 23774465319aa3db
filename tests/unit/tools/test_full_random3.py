"""The full-size random CosyVoice 3 writer, at the tiny sizes (the 3 GB model is never written
here), and its FULL spec against the published Fun-CosyVoice3-0.5B sizes (plain configs only)."""

from __future__ import annotations

import json
from pathlib import Path

from workers.model.directory import FAMILY_YAML, QWEN_DIR, ModelDirectory
from workers.model.dit.config import DiTFlowConfig
from workers.model.loader import CosyVoice3Configs, load_cosyvoice3
from workers.tools.fixtures.full_random import FULL_SPEC3, is_written, write_random_model
from workers.tools.fixtures.tiny3 import TinySpec3, _qwen_spec, render_yaml3
from workers.tools.fixtures.tiny_config import qwen2_config


def test_writer_at_tiny_sizes_loads_strictly_and_is_reused(tmp_path: Path) -> None:
    root, spec = tmp_path / "model", TinySpec3()
    directory = write_random_model(root, spec=spec, seed=3, hash_cache_dir=tmp_path / "h")
    assert ModelDirectory(root).family == "cosyvoice3"
    assert is_written(root, spec, 3) and not is_written(root, spec, 4)
    assert not is_written(root, FULL_SPEC3, 3)
    marker = json.loads((root / "cosyq-random-model.json").read_text())
    assert marker["family"] == "cosyvoice3" and marker["seed"] == 3
    assert list((tmp_path / "h").iterdir())  # hashes cached as a first worker would
    model = load_cosyvoice3(directory.root)  # every key, strict
    assert model.configs.llm.backbone.hidden_size == spec.llm_hidden
    assert model.configs.flow.estimator.depth == spec.dit_depth


def test_full_spec3_describes_the_published_model(tmp_path: Path) -> None:
    (tmp_path / FAMILY_YAML["cosyvoice3"]).write_text(render_yaml3(FULL_SPEC3))
    (tmp_path / QWEN_DIR).mkdir()
    config = json.dumps(qwen2_config(_qwen_spec(FULL_SPEC3)))
    (tmp_path / QWEN_DIR / "config.json").write_text(config)
    configs = CosyVoice3Configs.from_directory(ModelDirectory(tmp_path))
    backbone = configs.llm.backbone  # the reference set's "full" qwen2_config
    assert (backbone.hidden_size, backbone.num_layers, backbone.num_heads) == (896, 24, 14)
    assert (backbone.num_kv_heads, backbone.intermediate_size) == (2, 4864)
    assert backbone.vocab_size == 151936
    assert configs.flow == DiTFlowConfig()  # dim 1024, depth 22, 16 heads of 64, lookahead 1024
    assert configs.hift.base.base_channels == 512
