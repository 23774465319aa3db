"""Backend selection: Linux refuses Core ML in one line; auto prefers a valid conversion."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from shared.errors import ModelLoadError
from shared.settings import Settings
from tests.unit.coreml.micro import Converted
from workers.service.backend import coreml_dir_for, select_backend


def settings(tmp_path: Path, **values: Any) -> Settings:
    return Settings(_env_file=None, coreml_cache_dir=tmp_path / "cache", **values)


def devices(*names: str) -> Any:
    return lambda: {"cpu", *names}


def test_coreml_on_linux_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError) as error:
        select_backend(settings(tmp_path, backend="coreml"), tmp_path, platform="linux")
    assert str(error.value) == "Core ML runs only on macOS; use COSYQ_BACKEND=torch"


@pytest.mark.parametrize(
    ("available", "expected"),
    [((), "cpu"), (("cuda",), "cuda"), (("mps", "cuda"), "mps")],
)
def test_auto_on_linux_picks_the_best_torch_device(
    tmp_path: Path, available: tuple[str, ...], expected: str
) -> None:
    choice = select_backend(
        settings(tmp_path), tmp_path, platform="linux", torch_devices=devices(*available)
    )
    assert (choice.backend, choice.device, choice.torch_device) == ("torch", expected, expected)
    assert choice.reason.startswith("auto: ")


def test_an_unavailable_torch_device_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="COSYQ_DEVICE=cuda: cuda is not available"):
        select_backend(
            settings(tmp_path, backend="torch", device="cuda"),
            tmp_path,
            platform="linux",
            torch_devices=devices(),
        )


def test_auto_on_macos_takes_a_valid_conversion(converted: Converted, tmp_path: Path) -> None:
    base = settings(tmp_path, coreml_dir=converted.out_dir)
    choice = select_backend(
        base, converted.model_dir, platform="darwin", torch_devices=devices("mps")
    )
    assert (choice.backend, choice.device, choice.compute_units) == ("coreml", "ane/gpu/cpu", "ALL")
    assert choice.torch_device == "mps" and choice.coreml_dir == converted.out_dir
    assert "the conversion's default" in choice.reason
    pinned = settings(tmp_path, coreml_dir=converted.out_dir, compute_units="CPU_ONLY")
    choice = select_backend(pinned, converted.model_dir, platform="darwin", torch_devices=devices())
    assert (choice.device, choice.compute_units, choice.torch_device) == ("cpu", "CPU_ONLY", "cpu")
    assert "COSYQ_COMPUTE_UNITS" in choice.reason


def test_a_stale_conversion_is_passed_over_by_auto_and_refused_by_coreml(
    converted: Converted, tmp_path: Path
) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(converted.model_dir, model_dir)
    with (model_dir / "flow.pt").open("ab") as f:
        f.write(b"\0")
    auto = settings(tmp_path, coreml_dir=converted.out_dir)
    choice = select_backend(auto, model_dir, platform="darwin", torch_devices=devices("mps"))
    assert (choice.backend, choice.device) == ("torch", "mps")
    assert "Core ML passed over: stale Core ML conversion: flow.pt has changed" in choice.reason
    forced = settings(tmp_path, backend="coreml", coreml_dir=converted.out_dir)
    with pytest.raises(ModelLoadError, match="COSYQ_BACKEND=coreml: stale Core ML conversion"):
        select_backend(forced, model_dir, platform="darwin", torch_devices=devices("mps"))


def test_the_other_familys_conversion_is_passed_over_by_auto_and_refused_by_coreml(
    converted3: Converted, micro_model_dir: Path, tmp_path: Path
) -> None:
    """A CosyVoice 3 conversion beside a CosyVoice 2 directory: never loaded for it."""
    auto = settings(tmp_path, coreml_dir=converted3.out_dir)
    choice = select_backend(auto, micro_model_dir, platform="darwin", torch_devices=devices())
    assert choice.backend == "torch"
    assert "conversion is of a cosyvoice3 model, the model directory is cosyvoice2" in choice.reason
    forced = settings(tmp_path, backend="coreml", coreml_dir=converted3.out_dir)
    with pytest.raises(ModelLoadError, match="COSYQ_BACKEND=coreml: Core ML conversion is of a"):
        select_backend(forced, micro_model_dir, platform="darwin", torch_devices=devices())


def test_without_a_conversion_macos_runs_torch_on_mps(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    assert coreml_dir_for(settings(tmp_path), model_dir) == model_dir / "coreml"
    choice = select_backend(
        settings(tmp_path), model_dir, platform="darwin", torch_devices=devices("mps")
    )
    assert (choice.backend, choice.device) == ("torch", "mps")
    assert "no Core ML conversion here" in choice.reason
    with pytest.raises(ModelLoadError, match=r"COSYQ_BACKEND=coreml: .*no Core ML conversion"):
        select_backend(
            settings(tmp_path, backend="coreml"),
            model_dir,
            platform="darwin",
            torch_devices=devices(),
        )
