"""The manifest: round trip, malformed files, stale checkpoints and modified packages."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from shared.errors import ModelLoadError
from tests.unit.coreml.micro import Converted
from workers.coreml.manifest import (
    MANIFEST_FILE,
    DimRange,
    Manifest,
    PackageEntry,
    check_packages,
    check_sources,
    read_manifest,
)
from workers.coreml.stages import TensorSpec


def small_manifest() -> Manifest:
    entry = PackageEntry(
        stage="flow_cfm",
        path="flow_cfm.mlpackage",
        sha256="0" * 64,
        size_bytes=10,
        weights_bytes=5,
        precision="fp16",
        compression="int8",
        inputs=(TensorSpec("frames", "float32", (1, 241, "T")),),
        outputs=(TensorSpec("mel", "float32", (1, 80, "T")),),
        dims={"T": DimRange(2, 15000)},
    )
    return Manifest(
        model_name="m",
        source_checkpoints={"flow.pt": "1" * 64},
        tools={"coremltools": "9.0"},
        precision="fp16",
        weights="int8",
        target="macOS14",
        compute_units="CPU_AND_NE",
        packages={"flow_cfm": entry},
    )


def test_round_trip(tmp_path: Path) -> None:
    manifest = small_manifest()
    manifest.write(tmp_path)
    assert read_manifest(tmp_path) == manifest


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no Core ML conversion here"),
        ("{not json", "malformed manifest"),
        ('{"format": 99}', "manifest format 99"),
        ('{"format": 1, "packages": {}}', "malformed manifest"),
    ],
)
def test_unreadable_manifests_are_named(tmp_path: Path, content: str | None, message: str) -> None:
    if content is not None:
        (tmp_path / MANIFEST_FILE).write_text(content)
    with pytest.raises(ModelLoadError, match=message) as error:
        read_manifest(tmp_path)
    assert MANIFEST_FILE in str(error.value)


def test_a_conversion_of_other_weights_is_refused(converted: Converted, tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(converted.model_dir, model_dir)
    check_sources(converted.manifest, model_dir)  # same bytes: accepted
    with (model_dir / "hift.pt").open("ab") as f:
        f.write(b"\0")
    with pytest.raises(ModelLoadError, match=r"stale Core ML conversion: hift\.pt has changed"):
        check_sources(converted.manifest, model_dir)
    (model_dir / "flow.pt").unlink()
    with pytest.raises(ModelLoadError, match=r"flow\.pt, which is missing"):
        check_sources(converted.manifest, model_dir)


def test_a_modified_package_is_refused(converted: Converted, tmp_path: Path) -> None:
    folder = tmp_path / "coreml"
    shutil.copytree(converted.out_dir, folder)
    check_packages(converted.manifest, folder)
    weights = folder / "hift_decode.mlpackage" / "Data/com.apple.CoreML/weights/weight.bin"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="package for hift_decode differs"):
        check_packages(converted.manifest, folder)


def test_the_json_names_every_documented_field(converted: Converted) -> None:
    raw = json.loads((converted.out_dir / MANIFEST_FILE).read_text())
    assert {"source_checkpoints", "tools", "precision", "weights", "target", "compute_units",
            "packages", "format", "model_name", "created_utc"} <= set(raw)  # fmt: skip
    for entry in raw["packages"].values():
        assert {"path", "sha256", "size_bytes", "weights_bytes", "precision", "compression",
                "inputs", "outputs", "dims", "buckets"} <= set(entry)  # fmt: skip
        for tensor in entry["inputs"] + entry["outputs"]:
            assert set(tensor) == {"name", "dtype", "shape"}
