"""`cosyq-worker model init-tiny` and `model check-reference` through the real CLI entry."""

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from shared.errors import ModelLoadError
from workers.cli import main
from workers.model.loader import load_model
from workers.tools.reference.check import REQUIRED_FILES, run_reference_checks
from workers.tools.reference.parity import ReferenceSet


def test_check_reference_passes_on_the_shared_set(
    reference_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["model", "check-reference", str(reference_dir)]) == 0
    out = capsys.readouterr().out
    assert "llm_reference:logits" in out and "flow_reference:mel_nonstream" in out
    assert "hift_reference.npz:infer_wav" in out and "whisper_logmel128_1" in out
    assert "stream_chunks:mel_stream_finalize" in out  # the engine's streamed flow, by default
    for stage in ("llm", "flow", "hift"):
        assert f"ok   full-size keys {stage}: 0 differences" in out
    assert "FAIL" not in out


def test_check_reference_fails_on_a_perturbed_checkpoint(
    reference_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in REQUIRED_FILES:
        shutil.copy(reference_dir / name, tmp_path / name)
    state = torch.load(tmp_path / "hift.pt", weights_only=True)
    state["conv_post.bias"] = state["conv_post.bias"] + 0.05
    torch.save(state, tmp_path / "hift.pt")
    assert main(["model", "check-reference", str(tmp_path), "--stages", "hift"]) == 1
    out = capsys.readouterr().out
    assert "FAIL hift_reference.npz:wav_fixed" in out
    assert "llm_reference" not in out


def test_check_reference_names_missing_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert main(["model", "check-reference", str(tmp_path)]) == 2
    assert "missing llm.pt" in capsys.readouterr().err


def test_a_set_without_flow_weights_checks_the_other_stages(
    reference_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the GPU check carries (flow.pt alone is over half the 64 MiB a call may take)."""
    for name in REQUIRED_FILES:
        if name != "flow.pt":
            shutil.copy(reference_dir / name, tmp_path / name)
    assert main(["model", "check-reference", str(tmp_path), "--stages", "hift"]) == 0
    assert "ok   hift_reference.npz:wav_fixed" in capsys.readouterr().out
    assert main(["model", "check-reference", str(tmp_path), "--stages", "hift,flow"]) == 2
    assert "missing flow.pt" in capsys.readouterr().err


def test_reference_report_counts_key_list_differences(reference_dir: Path, tmp_path: Path) -> None:
    for name in (*REQUIRED_FILES, "frontend_reference.npz", "keys-llm.txt"):
        shutil.copy(reference_dir / name, tmp_path / name)
    lines = (tmp_path / "keys-llm.txt").read_text().splitlines()
    (tmp_path / "keys-llm.txt").write_text("\n".join(lines[:-1]) + "\n")
    report = run_reference_checks(ReferenceSet(tmp_path), torch.device("cpu"), ("llm",))
    assert report.key_problems["llm"]
    assert not report.passed
    assert all(c.passed for c in report.checks)


def test_init_tiny_writes_a_directory_that_loads_strictly(tmp_path: Path) -> None:
    assert main(["model", "init-tiny", str(tmp_path / "tiny"), "--seed", "3"]) == 0
    model = load_model(tmp_path / "tiny")
    assert model.configs.llm.backbone.hidden_size == 64
    assert not model.flow.training and not model.hift.training
    main(["model", "init-tiny", str(tmp_path / "again"), "--seed", "3"])
    main(["model", "init-tiny", str(tmp_path / "other"), "--seed", "4"])
    same = load_model(tmp_path / "again").checkpoint_hash
    assert same == model.checkpoint_hash
    assert load_model(tmp_path / "other").checkpoint_hash != same


def test_tiny_model_synthesizes_finite_voiced_audio(tmp_path: Path) -> None:
    main(["model", "init-tiny", str(tmp_path)])
    model = load_model(tmp_path)
    tokens = torch.randint(0, 6561, (1, 30), generator=torch.Generator().manual_seed(0))
    prompt_feat = torch.randn(1, 20, 80, generator=torch.Generator().manual_seed(1)) - 5
    embedding = torch.randn(1, 192, generator=torch.Generator().manual_seed(2))
    mel, _ = model.flow.inference(tokens[:, 10:], tokens[:, :10], prompt_feat, embedding)
    assert mel.shape == (1, 80, 40)
    assert torch.isfinite(mel).all()
    out = model.hift.inference(mel, generator=torch.Generator().manual_seed(0))
    wav = out.wav.numpy()
    assert wav.shape[-1] == 40 * 480
    assert np.isfinite(wav).all() and np.abs(wav).max() > 1e-3
    assert float((out.f0 > 10).float().mean()) > 0.5


def _edit(path: Path, key: str, value: torch.Tensor | None) -> None:
    state = torch.load(path, weights_only=True)
    if value is None:
        del state[key]
    else:
        state[key] = value
    torch.save(state, path)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:5000])


DAMAGES: list[tuple[Callable[[Path], None], str]] = [
    (lambda d: (d / "flow.pt").unlink(), r"flow\.pt \(the flow-matching state_dict"),
    (lambda d: _truncate(d / "llm.pt"), r"llm\.pt: not a readable torch checkpoint"),
    (
        lambda d: _edit(d / "hift.pt", "conv_post.bias", torch.zeros(7)),
        r"hift\.pt: .*wrong shapes.*conv_post\.bias",
    ),
    (
        lambda d: _edit(d / "flow.pt", "extra.weight", torch.zeros(1)),
        r"flow\.pt: .*unexpected keys: extra\.weight",
    ),
    (
        lambda d: _edit(d / "llm.pt", "llm_decoder.bias", None),
        r"llm\.pt: .*missing keys: llm_decoder\.bias",
    ),
]


@pytest.mark.parametrize(("damage", "message"), DAMAGES)
def test_damaged_directories_fail_naming_file_and_problem(
    tmp_path: Path, damage: Callable[[Path], None], message: str
) -> None:
    main(["model", "init-tiny", str(tmp_path)])
    damage(tmp_path)
    with pytest.raises(ModelLoadError, match=message):
        load_model(tmp_path)


def test_stages_another_runtime_replaces_are_not_loaded(tmp_path: Path) -> None:
    main(["model", "init-tiny", str(tmp_path)])
    (tmp_path / "flow.pt").write_bytes(b"unused under Core ML: never read")
    model = load_model(tmp_path, torch_stages=frozenset({"hift"}))
    assert model.flow is None and model.hift is not None and model.llm is not None
    with pytest.raises(ModelLoadError, match=r"flow\.pt"):
        load_model(tmp_path)
