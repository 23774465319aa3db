"""The manifest: round trip, malformed files, stale checkpoints and modified packages."""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import asdict
from pathlib import Path

import pytest

from shared.errors import ModelLoadError
from tests.unit.coreml.micro import Converted
from workers.coreml.manifest import (
    MANIFEST_FILE,
    DimRange,
    Manifest,
    PackageEntry,
    check_family,
    check_packages,
    check_sources,
    ignore_transient_package_files,
    package_sha256,
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
    # another test process may have a package of this shared folder open meanwhile
    shutil.copytree(converted.out_dir, folder, ignore=ignore_transient_package_files)
    check_packages(converted.manifest, folder)
    weights = folder / "hift_decode.mlpackage" / "Data/com.apple.CoreML/weights/weight.bin"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match="package for hift_decode differs"):
        check_packages(converted.manifest, folder)


def test_coremltools_transient_manifest_is_not_part_of_the_package(
    converted: Converted, tmp_path: Path
) -> None:
    """Opening a package makes coremltools write `Manifest.<uuid>` into it and rename it over
    Manifest.json: a worker hashing the package meanwhile must not call it modified."""
    package = tmp_path / "hift_decode.mlpackage"
    shutil.copytree(
        converted.out_dir / "hift_decode.mlpackage", package, ignore=ignore_transient_package_files
    )
    expected = converted.manifest.packages["hift_decode"].sha256
    assert package_sha256(package) == expected
    (package / "Manifest.2fc9dd45-00ba-4b87-8714-6ac214a47b93").write_text("{}")
    assert package_sha256(package) == expected
    (package / "Data" / "Manifest.extra").write_text("{}")  # below the root: package content
    assert package_sha256(package) != expected


def test_the_json_names_every_documented_field(converted: Converted) -> None:
    raw = json.loads((converted.out_dir / MANIFEST_FILE).read_text())
    assert {"source_checkpoints", "tools", "precision", "weights", "target", "compute_units",
            "packages", "format", "model_name", "created_utc",
            "flow_steps", "family"} <= set(raw)  # fmt: skip
    for entry in raw["packages"].values():
        assert {"path", "sha256", "size_bytes", "weights_bytes", "precision", "compression",
                "inputs", "outputs", "dims", "buckets"} <= set(entry)  # fmt: skip
        for tensor in entry["inputs"] + entry["outputs"]:
            assert set(tensor) == {"name", "dtype", "shape"}


def batched_entry(sizes: tuple[int, ...] = (1, 2, 4, 8)) -> PackageEntry:
    return dataclasses.replace(
        small_manifest().packages["flow_cfm"],
        inputs=(TensorSpec("frames", "float32", ("B", 241, "T")),),
        outputs=(TensorSpec("mel", "float32", ("B", 80, "T")),),
        dims={"B": DimRange(1, sizes[-1]), "T": DimRange(2, 15000)},
        batch_sizes=sizes,
    )


def test_batch_sizes_round_trip_and_their_absence_means_batch_1(tmp_path: Path) -> None:
    manifest = dataclasses.replace(small_manifest(), packages={"flow_cfm": batched_entry()})
    manifest.write(tmp_path)
    assert read_manifest(tmp_path) == manifest
    assert read_manifest(tmp_path).packages["flow_cfm"].batches.largest == 8
    old = json.loads((tmp_path / MANIFEST_FILE).read_text())
    old["packages"] = {"flow_cfm": asdict(small_manifest().packages["flow_cfm"])}
    del old["packages"]["flow_cfm"]["batch_sizes"]  # written before batching existed
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(old))
    entry = read_manifest(tmp_path).packages["flow_cfm"]
    assert entry.batch_sizes == (1,) and not entry.batches.batched


def test_the_family_round_trips_and_its_absence_means_cosyvoice2(tmp_path: Path) -> None:
    manifest = dataclasses.replace(small_manifest(), family="cosyvoice3")
    manifest.write(tmp_path)
    assert read_manifest(tmp_path).family == "cosyvoice3"
    check_family(manifest, "cosyvoice3")
    with pytest.raises(ModelLoadError, match="is of a cosyvoice3 model, the model directory is"):
        check_family(manifest, "cosyvoice2")
    old = json.loads((tmp_path / MANIFEST_FILE).read_text())
    del old["family"]  # written before CosyVoice 3 converted
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(old))
    assert read_manifest(tmp_path).family == "cosyvoice2"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"batch_sizes": [2, 4]}, r"flow_cfm: batch sizes 2,4: strictly increasing"),
        ({"batch_sizes": [1, 4, 2]}, r"flow_cfm: batch sizes 1,4,2"),
        ({"batch_sizes": [1, 64]}, r"from 1 up to 16"),
        ({"inputs": [{"name": "frames", "dtype": "float32", "shape": [1, 241, "T"]}]},
         r"flow_cfm: batch sizes \[1, 2, 4, 8\] but input\(s\) frames do not start with 'B'"),
    ],
)  # fmt: skip
def test_bad_batch_sizes_are_refused_when_loaded(
    tmp_path: Path, change: dict[str, object], message: str
) -> None:
    dataclasses.replace(small_manifest(), packages={"flow_cfm": batched_entry()}).write(tmp_path)
    raw = json.loads((tmp_path / MANIFEST_FILE).read_text())
    raw["packages"]["flow_cfm"].update(change)
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(raw))
    with pytest.raises(ModelLoadError, match=f"malformed manifest .*{message}"):
        read_manifest(tmp_path)


def test_asking_for_a_batch_size_the_package_lacks_names_the_sizes_it_has() -> None:
    sizes = batched_entry((1, 2, 4)).batches
    sizes.require(4, "flow_cfm")
    with pytest.raises(ValueError, match=r"flow_cfm: no batch size 8 .*\(it has 1, 2, 4\)"):
        sizes.require(8, "flow_cfm")
    with pytest.raises(ValueError, match="no batch size 2"):
        small_manifest().packages["flow_cfm"].batches.require(2, "flow_cfm")
