"""Doctor's Core ML model rows on Linux: the manifest checks need no Core ML runtime."""

from __future__ import annotations

import shutil
from pathlib import Path

from shared.settings import Settings
from tests.unit.coreml.micro import Converted
from workers.tools.doctor.model_checks import cache_row, packages_row
from workers.tools.doctor.rows import COREML_ONLY_ON_MACOS, Status


def settings_for(model_dir: Path, coreml_dir: Path, tmp_path: Path, backend: str) -> Settings:
    return Settings(
        model_dir=model_dir,
        coreml_dir=coreml_dir,
        coreml_cache_dir=tmp_path / "cache",
        hash_cache_dir=tmp_path / "hashes",
        backend=backend,
    )


def test_a_valid_conversion_matches_its_checkpoints(converted: Converted, tmp_path: Path) -> None:
    settings = settings_for(converted.model_dir, converted.out_dir, tmp_path, "auto")
    row = packages_row(settings, converted.model_dir, converted.out_dir)
    assert row.status is Status.OK, row.detail
    assert "flow_cfm" in row.detail or "cfm" in row.detail
    cache = cache_row(settings, converted.out_dir, system="linux")
    assert cache.status is Status.SKIP and cache.detail == COREML_ONLY_ON_MACOS


def test_a_stale_conversion_is_named_and_fails_unless_torch_is_chosen(
    converted: Converted, tmp_path: Path
) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(converted.model_dir, model_dir)
    with (model_dir / "hift.pt").open("ab") as f:
        f.write(b"\0")  # other weights than the conversion was made from
    stale = packages_row(
        settings_for(model_dir, converted.out_dir, tmp_path, "auto"), model_dir, converted.out_dir
    )
    assert stale.status is Status.FAIL and stale.fails
    assert "hift.pt has changed" in stale.detail and "cosyq-worker convert" in stale.hint
    torch_only = packages_row(
        settings_for(model_dir, converted.out_dir, tmp_path, "torch"), model_dir, converted.out_dir
    )
    assert torch_only.status is Status.FAIL and not torch_only.fails


def test_no_conversion_is_a_skip_unless_coreml_is_chosen(
    converted: Converted, tmp_path: Path
) -> None:
    empty = tmp_path / "no-coreml"
    auto = packages_row(
        settings_for(converted.model_dir, empty, tmp_path, "auto"), converted.model_dir, empty
    )
    assert auto.status is Status.SKIP and "no Core ML conversion" in auto.detail
    chosen = packages_row(
        settings_for(converted.model_dir, empty, tmp_path, "coreml"), converted.model_dir, empty
    )
    assert chosen.fails
