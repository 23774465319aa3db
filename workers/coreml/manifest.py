"""`manifest.json`: what a conversion produced, from which checkpoints, with which tools.

Written by `cosyq-worker convert` next to the packages and read by the runtime and by backend
selection (no coremltools needed to read it). It records the model family (cosyvoice2 or
cosyvoice3; a worker refuses the other family's conversion), the source checkpoints' SHA-256 (a
worker refuses a conversion made from other weights), tool versions, precision, compression,
flexible dimensions or shape buckets, every input/output name, dtype and shape, and each
package's content hash (the compiled-model cache key).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from shared.errors import ModelLoadError
from workers.coreml.batch_sizes import BatchSizes, check_batch_sizes
from workers.coreml.stages import BATCH, UNBATCHED, TensorSpec
from workers.model.directory import ModelDirectory, file_sha256

MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1


@dataclass(frozen=True)
class DimRange:
    """A flexible axis: any length from `lower` to `upper` (inclusive)."""

    lower: int
    upper: int


@dataclass(frozen=True)
class PackageEntry:
    """One `.mlpackage`: where it is, its hash, and how to call it."""

    stage: str
    path: str  # relative to the manifest's folder
    sha256: str
    size_bytes: int
    weights_bytes: int
    precision: str  # "fp16" | "fp32" (compute precision inside the package)
    compression: str  # "none" | "int8" | "int8-block" | "palette6" | "palette4"
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    dims: dict[str, DimRange] = field(default_factory=dict)  # flexible axes by symbol
    buckets: tuple[int, ...] = ()  # enumerated lengths of axis T (empty: flexible)
    functions: dict[str, tuple[TensorSpec, ...]] = field(default_factory=dict)  # inputs per
    # function of a multifunction package (the LLM's prefill and decode); empty: one "main"
    states: tuple[TensorSpec, ...] = ()  # Core ML states (the LLM's KV cache)
    batch_sizes: tuple[int, ...] = UNBATCHED  # enumerated rows per call (axis B); (1,): no B

    def __post_init__(self) -> None:
        """ValueError for batch sizes that are not 1 < ... <= 16, or that disagree with the
        inputs (a batched package's inputs start with axis B, an unbatched one's with 1)."""
        try:
            check_batch_sizes(self.batch_sizes)
        except ValueError as e:
            raise ValueError(f"{self.stage}: {e}") from e
        first = BATCH if self.batch_sizes != UNBATCHED else 1
        wrong = [t.name for t in self.inputs if not t.shape or t.shape[0] != first]
        if wrong and not self.functions:  # the LLM's multifunction inputs are batch 1
            raise ValueError(
                f"{self.stage}: batch sizes {list(self.batch_sizes)} but input(s) "
                f"{', '.join(wrong)} do not start with {first!r}"
            )

    @property
    def batches(self) -> BatchSizes:
        return BatchSizes(self.batch_sizes)


@dataclass(frozen=True)
class Manifest:
    """The whole conversion; `packages` is keyed by stage name (see `stages`)."""

    model_name: str
    source_checkpoints: dict[str, str]  # "flow.pt" -> sha256
    tools: dict[str, str]  # coremltools, torch, numpy, python versions
    precision: str
    weights: str
    target: str  # "macOS14" | "macOS15"
    compute_units: str  # default for the runtime (COSYQ_COMPUTE_UNITS overrides)
    packages: dict[str, PackageEntry]
    # Euler steps unrolled into flow_cfm; None: a manifest from before they were recorded,
    # whose conversion unrolled the model's own (10)
    flow_steps: int | None = None
    # the model directory's family; a manifest from before it was recorded is CosyVoice 2's,
    # the only family converted then
    family: str = "cosyvoice2"
    created_utc: str = ""
    format: int = MANIFEST_FORMAT

    def write(self, folder: Path) -> Path:
        """Write `manifest.json` atomically into `folder`."""
        path = folder / MANIFEST_FILE
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(asdict(self), indent=2, sort_keys=False) + "\n")
        tmp.replace(path)
        return path


def read_manifest(folder: Path) -> Manifest:
    """Read and validate `folder/manifest.json`; ModelLoadError names the file and the field."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        raise ModelLoadError(f"{path}: no Core ML conversion here (run cosyq-worker convert)")
    try:
        doc = json.loads(path.read_text())
        if doc.get("format") != MANIFEST_FORMAT:
            raise ModelLoadError(
                f"{path}: manifest format {doc.get('format')!r}, this cosyq reads "
                f"{MANIFEST_FORMAT}; convert again"
            )
        packages = {name: _package(entry) for name, entry in doc.pop("packages").items()}
        return Manifest(packages=packages, **doc)
    except ModelLoadError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise ModelLoadError(f"{path}: malformed manifest ({type(e).__name__}: {e})") from e


def _tensor(entry: dict[str, Any]) -> TensorSpec:
    return TensorSpec(entry["name"], entry["dtype"], tuple(entry["shape"]))


def _package(entry: dict[str, Any]) -> PackageEntry:
    return PackageEntry(
        **{
            **entry,
            "inputs": tuple(_tensor(t) for t in entry["inputs"]),
            "outputs": tuple(_tensor(t) for t in entry["outputs"]),
            "dims": {k: DimRange(**v) for k, v in entry.get("dims", {}).items()},
            "buckets": tuple(entry.get("buckets", ())),
            "functions": {
                name: tuple(_tensor(t) for t in inputs)
                for name, inputs in entry.get("functions", {}).items()
            },
            "states": tuple(_tensor(t) for t in entry.get("states", ())),
            "batch_sizes": tuple(entry.get("batch_sizes", UNBATCHED)),
        }
    )


def is_transient_package_file(name: str) -> bool:
    """coremltools rewrites a package's Manifest.json each time it opens it, by writing
    `Manifest.<uuid>` beside it and renaming that over it: such a file is there for
    milliseconds, while another process (a worker, a pool sibling) has the package open, and
    is not part of the package."""
    return name.startswith("Manifest.") and name != "Manifest.json"


def ignore_transient_package_files(directory: str, names: list[str]) -> set[str]:
    """`shutil.copytree(..., ignore=...)` for a package folder another process may open."""
    return {name for name in names if is_transient_package_file(name)}


def package_files(path: Path) -> list[Path]:
    """The files that make an .mlpackage, sorted, without coremltools' transient manifests."""
    return sorted(
        p
        for p in path.rglob("*")
        if p.is_file() and not (p.parent == path and is_transient_package_file(p.name))
    )


def package_sha256(path: Path, cache_dir: Path | None = None) -> str:
    """Content hash of an .mlpackage folder: every file's relative path and SHA-256, sorted."""
    if not path.is_dir():
        raise ModelLoadError(f"{path}: Core ML package missing")
    digest = hashlib.sha256()
    for file in package_files(path):
        digest.update(f"{file.relative_to(path).as_posix()}\0".encode())
        digest.update(file_sha256(file, cache_dir).encode())
    return digest.hexdigest()


def check_sources(manifest: Manifest, model_dir: Path, hash_cache: Path | None = None) -> None:
    """Refuse a stale conversion: every recorded checkpoint must hash as it did at conversion."""
    directory = ModelDirectory(model_dir)
    for name, recorded in sorted(manifest.source_checkpoints.items()):
        path = directory.path(name)
        if not path.is_file():
            raise ModelLoadError(f"Core ML conversion needs {path}, which is missing")
        current = file_sha256(path, hash_cache)
        if current != recorded:
            raise ModelLoadError(
                f"stale Core ML conversion: {name} has changed since it was converted "
                f"(sha256 {current[:12]}, converted from {recorded[:12]}); run "
                f"`cosyq-worker convert {model_dir} <out>` again or use COSYQ_BACKEND=torch"
            )


def check_family(manifest: Manifest, family: str) -> None:
    """Refuse a conversion of the other family (the packages of CosyVoice 2's U-Net flow and
    HiFT cannot serve CosyVoice 3's DiT and causal HiFT, nor the reverse): ModelLoadError
    names both and how to convert again."""
    if manifest.family != family:
        raise ModelLoadError(
            f"Core ML conversion is of a {manifest.family} model, the model directory is "
            f"{family}; run `cosyq-worker convert MODEL_DIR OUT_DIR` on this directory again"
        )


def check_flow_steps(manifest: Manifest, model_steps: int, asked: int | None) -> int:
    """The conversion's Euler steps, which must be those the engine asks for (`asked`; None:
    the model's own `model_steps`): ModelLoadError names both and how to convert again."""
    built = manifest.flow_steps if manifest.flow_steps is not None else model_steps
    wanted = asked if asked is not None else model_steps
    if built != wanted:
        raise ModelLoadError(
            f"Core ML conversion's flow_cfm solves in {built} Euler steps, the engine asks for "
            f"{wanted}; run `cosyq-worker convert --flow-steps {wanted}` again"
        )
    return built


def check_packages(manifest: Manifest, folder: Path, hash_cache: Path | None = None) -> None:
    """Every package the manifest names exists and still has the recorded content hash."""
    for stage, entry in sorted(manifest.packages.items()):
        current = package_sha256(folder / entry.path, hash_cache)
        if current != entry.sha256:
            raise ModelLoadError(
                f"{folder / entry.path}: package for {stage} differs from the one in "
                f"{folder / MANIFEST_FILE} (modified or copied incompletely); convert again"
            )
