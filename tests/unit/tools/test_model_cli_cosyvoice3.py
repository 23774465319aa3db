"""`cosyq-worker model check-reference` on the CosyVoice 3 reference set (family from its
config.json), through the real CLI entry."""

import shutil
from pathlib import Path

import pytest
import torch

from workers.cli import main
from workers.tools.reference.check import REQUIRED_FILES


def test_check_reference_passes_on_the_cosyvoice3_set(
    reference3_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["model", "check-reference", str(reference3_dir)]) == 0
    out = capsys.readouterr().out
    assert "llm_reference:infer_all_drawn" in out and "flow_reference:dit_step0_block1_out" in out
    assert "hift_reference.npz:real_model_sine_waves_first2400" in out
    assert "session_reference:session_stream_speech" in out and "speech_feat_1" in out
    for stage in ("llm", "flow", "hift"):
        assert f"ok   full-size keys {stage}: 0 differences" in out
    assert "FAIL" not in out


def test_a_cosyvoice2_only_stage_is_refused_for_a_cosyvoice3_set(
    reference3_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["model", "check-reference", str(reference3_dir), "--stages", "stream"]) == 2
    assert "choose from llm, flow, hift, session, features" in capsys.readouterr().err


def test_check_reference_fails_on_a_perturbed_cosyvoice3_checkpoint(
    reference3_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in REQUIRED_FILES:
        shutil.copy(reference3_dir / name, tmp_path / name)
    state = torch.load(tmp_path / "hift.pt", weights_only=True)
    state["conv_post.bias"] = state["conv_post.bias"] + 0.05
    torch.save(state, tmp_path / "hift.pt")
    assert main(["model", "check-reference", str(tmp_path), "--stages", "hift"]) == 1
    out = capsys.readouterr().out
    assert "FAIL hift_reference.npz:wav_fixed" in out
    assert "llm_reference" not in out


def test_doctor_names_the_directorys_family(tiny3_model_dir: Path, tmp_path: Path) -> None:
    from workers.tools.doctor.model_checks import layout_row  # noqa: PLC0415

    row = layout_row(tiny3_model_dir, tmp_path / "hashes")
    assert row.status.value == "ok", row.detail
    assert "CosyVoice 3 (from cosyvoice3.yaml)" in row.detail
    assert row.figures is not None and row.figures["family"] == "cosyvoice3"
