"""Model-directory layout checks and checkpoint hashing."""

from pathlib import Path

import pytest

from shared.errors import ModelLoadError
from workers.model.directory import (
    EXPECTED_FILES,
    ModelDirectory,
    checkpoint_hashes,
    combined_hash,
    file_sha256,
)


def _fill(root: Path) -> None:
    for name in EXPECTED_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(name.encode())


def test_every_missing_file_is_named_with_its_purpose(tmp_path: Path) -> None:
    _fill(tmp_path)
    (tmp_path / "flow.pt").unlink()
    (tmp_path / "CosyVoice-BlankEN" / "merges.txt").unlink()
    with pytest.raises(ModelLoadError) as info:
        ModelDirectory(tmp_path).check_layout()
    message = str(info.value)
    assert "flow.pt (the flow-matching state_dict" in message
    assert "CosyVoice-BlankEN/merges.txt (the Qwen2 BPE merges)" in message
    assert "llm.pt" not in message


def test_complete_layout_passes_and_missing_directory_fails(tmp_path: Path) -> None:
    _fill(tmp_path)
    ModelDirectory(tmp_path).check_layout()
    with pytest.raises(ModelLoadError, match="model directory not found"):
        ModelDirectory(tmp_path / "nope").check_layout()


def test_hash_is_cached_by_size_and_mtime(tmp_path: Path) -> None:
    _fill(tmp_path)
    cache = tmp_path / "cache"
    first = checkpoint_hashes(ModelDirectory(tmp_path), cache)
    assert len(list(cache.iterdir())) == 3
    assert checkpoint_hashes(ModelDirectory(tmp_path), cache) == first
    (tmp_path / "hift.pt").write_bytes(b"changed weights")
    second = checkpoint_hashes(ModelDirectory(tmp_path), cache)
    assert second["hift.pt"] != first["hift.pt"]
    assert second["llm.pt"] == first["llm.pt"]
    assert combined_hash(second) != combined_hash(first)
    assert second["hift.pt"] == file_sha256(tmp_path / "hift.pt")
