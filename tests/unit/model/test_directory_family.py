"""The model family comes from the model directory: cosyvoice2.yaml or cosyvoice3.yaml."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from shared.errors import ModelLoadError
from workers.cli import main
from workers.model.causal_hift.config import CausalHiFTConfig
from workers.model.causal_hift.model import CausalHiFTGenerator
from workers.model.directory import ModelDirectory
from workers.model.dit.config import DiTFlowConfig
from workers.model.dit.model import CausalMaskedDiffWithDiT
from workers.model.loader import (
    CosyVoice3Configs,
    LoadedCosyVoice3,
    ModelConfigs,
    load_cosyvoice3,
    load_model,
)
from workers.model.yaml_plain import load_plain_yaml
from workers.tools.fixtures.full_random import FULL_SPEC3
from workers.tools.fixtures.tiny3 import render_yaml3
from workers.tools.reference.configs import (
    causal_hift_config_from_reference,
    dit_flow_config_from_reference,
)


@pytest.fixture(scope="module")
def tiny3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cv3") / "tiny"
    assert main(["model", "init-tiny", "--family", "cosyvoice3", str(root)]) == 0
    return root


@pytest.fixture(scope="module")
def loaded3(tiny3: Path) -> LoadedCosyVoice3:
    return load_cosyvoice3(tiny3)


def test_family_is_read_from_the_yaml(tiny_model_dir: Path, tiny3: Path) -> None:
    assert ModelDirectory(tiny_model_dir).family == "cosyvoice2"
    assert ModelDirectory(tiny3).family == "cosyvoice3"


def test_a_directory_of_neither_family_names_what_it_found(tmp_path: Path) -> None:
    (tmp_path / "llm.pt").write_bytes(b"")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(ModelLoadError, match=r"neither .* \(found: llm\.pt, notes\.txt\)"):
        ModelDirectory(tmp_path).check_layout()


def test_a_directory_with_both_yamls_is_refused(tiny3: Path, tmp_path: Path) -> None:
    shutil.copytree(tiny3, tmp_path / "both")
    (tmp_path / "both" / "cosyvoice2.yaml").write_text("llm: {}\n")
    with pytest.raises(ModelLoadError, match=r"both cosyvoice2\.yaml and cosyvoice3\.yaml found"):
        ModelDirectory(tmp_path / "both").check_layout()


def test_a_cosyvoice3_directory_needs_the_v3_speech_tokenizer(tiny3: Path, tmp_path: Path) -> None:
    shutil.copytree(tiny3, tmp_path / "d")
    (tmp_path / "d" / "speech_tokenizer_v3.onnx").unlink()
    with pytest.raises(ModelLoadError, match=r"missing speech_tokenizer_v3\.onnx"):
        ModelDirectory(tmp_path / "d").check_layout()


def test_the_engine_loader_takes_the_family_from_the_directory(tiny3: Path) -> None:
    loaded = load_model(tiny3, flow_steps=2)
    assert loaded.family == "cosyvoice3"
    assert isinstance(loaded.configs, CosyVoice3Configs)
    assert loaded.configs.flow.cfm.n_timesteps == 2
    assert isinstance(loaded.flow, CausalMaskedDiffWithDiT)
    assert isinstance(loaded.hift, CausalHiFTGenerator)
    with pytest.raises(ModelLoadError, match="a CosyVoice 3 model directory"):
        ModelConfigs.from_directory(ModelDirectory(tiny3))  # CosyVoice 2's configs alone


def test_published_yaml_form_reads_as_the_reference_full_config(
    reference3_dir: Path, tmp_path: Path
) -> None:
    config = json.loads((reference3_dir / "config.json").read_text())
    (tmp_path / "cosyvoice3.yaml").write_text(render_yaml3(FULL_SPEC3))  # the full-size writer's
    doc = load_plain_yaml(tmp_path / "cosyvoice3.yaml")
    assert DiTFlowConfig.from_model_yaml(doc) == dit_flow_config_from_reference(config, "full")
    hift = CausalHiFTConfig.from_model_yaml(doc)
    assert hift == causal_hift_config_from_reference(config, "full")


def test_tiny_cosyvoice3_loads_strictly_and_makes_finite_voiced_audio(
    loaded3: LoadedCosyVoice3,
) -> None:
    assert isinstance(loaded3.configs, CosyVoice3Configs)
    tokens = torch.randint(0, 6561, (1, 30), generator=torch.Generator().manual_seed(0))
    prompt_feat = torch.randn(1, 20, 80, generator=torch.Generator().manual_seed(1)) - 5
    embedding = torch.randn(1, 192, generator=torch.Generator().manual_seed(2))
    mel, _ = loaded3.flow.inference(tokens[:, 10:], tokens[:, :10], prompt_feat, embedding)
    assert mel.shape == (1, 80, 40) and torch.isfinite(mel).all()
    out = loaded3.hift.inference(mel)
    assert out.wav.shape == (1, 40 * 480) and torch.isfinite(out.wav).all()
    assert float(out.wav.abs().max()) > 1e-3
