"""Model rows: layout and strict checkpoint load, checkpoint hashes, the Core ML conversion
against its manifest, and the compiled-model cache.

The same checks a worker makes before it takes a job (`ModelDirectory.check_layout`,
`load_model`'s strict load, `check_sources`/`check_packages`), so a damaged file is named here
exactly as the worker would name it.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from shared.errors import CosyqError
from shared.settings import Settings
from workers.coreml.cache import HASH_PREFIX, is_complete
from workers.coreml.manifest import (
    MANIFEST_FILE,
    check_family,
    check_packages,
    check_sources,
    read_manifest,
)
from workers.coreml.stages import ALL_STAGES
from workers.model.directory import (
    FAMILY_NAMES,
    FAMILY_YAML,
    ModelDirectory,
    checkpoint_hashes,
    combined_hash,
)
from workers.service.backend import coreml_dir_for
from workers.service.cache_folders import unwritable_folder
from workers.tools.doctor.rows import COREML_ONLY_ON_MACOS, Row, fail, ok, one_line, skip

GROUP = "model"
LAYOUT = "layout and strict checkpoint load"
HASHES = "checkpoint hashes"
PACKAGES = "Core ML packages match the checkpoints"
CACHE = "compiled-model cache"
ROW_NAMES = (LAYOUT, HASHES, PACKAGES, CACHE)  # in report order
NO_MODEL_HINT = "set COSYQ_MODEL_DIR or pass --model-dir (cosyq-worker model init-tiny DIR "
NO_MODEL_HINT += "writes a tiny one)"


def model_rows(settings: Settings, root: Path | None, *, system: str = sys.platform) -> list[Row]:
    if root is None:
        missing = fail(GROUP, LAYOUT, "no model directory configured", NO_MODEL_HINT)
        return [missing, *(skip(GROUP, n, "no model directory") for n in (HASHES, PACKAGES, CACHE))]
    # an unwritable hash cache is the host row's ✗ (host_checks.cache_folders_row): hashed
    # here without it, so the model is still checked
    hash_cache: Path | None = settings.hash_cache_dir
    if unwritable_folder(settings.hash_cache_dir) is not None:
        hash_cache = None
    layout = layout_row(root, hash_cache)
    hashes = (
        hashes_row(root, hash_cache)
        if layout.status.value == "ok"
        else skip(GROUP, HASHES, "the model directory did not load")
    )
    folder = coreml_dir_for(settings, root)
    packages = packages_row(settings, root, folder)
    cache = cache_row(settings, folder, system=system)
    return [layout, hashes, packages, cache]


def layout_row(root: Path, hash_cache: Path | None) -> Row:
    from workers.model.loader import load_model  # noqa: PLC0415 (torch only when doctor runs)

    started = time.perf_counter()
    try:
        ModelDirectory(root).check_layout()
        loaded = load_model(root, device="cpu", hash_cache_dir=hash_cache)
    except (CosyqError, OSError) as e:  # OSError: a file this process may not read
        return fail(
            GROUP,
            LAYOUT,
            one_line(e),
            "restore the named file from the original download (or write the directory "
            "again), then rerun doctor",
        )
    seconds = time.perf_counter() - started
    params = sum(
        p.numel()
        for module in (loaded.llm, loaded.flow, loaded.hift)
        if module is not None
        for p in module.parameters()
    )
    family = FAMILY_NAMES.get(loaded.family, loaded.family)
    return ok(
        GROUP,
        LAYOUT,
        f"{root}: {family} (from {FAMILY_YAML[loaded.family]}), every file present, "
        f"llm/flow/hift loaded strictly ({params / 1e6:.1f} M parameters, {seconds:.1f} s)",
        load_s=round(seconds, 3),
        family=loaded.family,
    )


def hashes_row(root: Path, hash_cache: Path | None) -> Row:
    try:
        hashes = checkpoint_hashes(ModelDirectory(root), hash_cache)
    except OSError as e:
        return fail(GROUP, HASHES, one_line(e), "check the checkpoint files can be read")
    shown = ", ".join(f"{name} {value[:12]}" for name, value in sorted(hashes.items()))
    combined = combined_hash(hashes)
    return ok(GROUP, HASHES, f"{shown}; combined {combined}", sha256=hashes, combined=combined)


def packages_row(settings: Settings, root: Path, folder: Path) -> Row:
    if not (folder / MANIFEST_FILE).is_file():
        why = f"no Core ML conversion at {folder} (cosyq-worker convert {root} {folder})"
        if settings.backend == "coreml":
            return fail(GROUP, PACKAGES, why, f"run cosyq-worker convert {root} {folder}")
        return skip(GROUP, PACKAGES, why)
    hashes = settings.coreml_cache_dir / "hashes"
    try:
        manifest = read_manifest(folder)
        missing = [stage for stage in ALL_STAGES if stage not in manifest.packages]
        if missing:
            raise CosyqError(f"{folder}: conversion lacks {', '.join(missing)}")
        check_family(manifest, ModelDirectory(root).family)
        check_sources(manifest, root, hashes)
        check_packages(manifest, folder, hashes)
    except CosyqError as e:
        return fail(
            GROUP,
            PACKAGES,
            one_line(e),
            f"convert again: cosyq-worker convert {root} {folder}",
            required=settings.backend != "torch",
        )
    stages = ", ".join(sorted(manifest.packages))
    return ok(
        GROUP,
        PACKAGES,
        f"{folder}: {FAMILY_NAMES.get(manifest.family, manifest.family)} conversion, "
        f"{stages}; target {manifest.target}, "
        f"{manifest.precision}, weights {manifest.weights}, coremltools "
        f"{manifest.tools.get('coremltools', '?')}",
    )


def cache_row(settings: Settings, folder: Path, *, system: str = sys.platform) -> Row:
    if system != "darwin":
        return skip(GROUP, CACHE, COREML_ONLY_ON_MACOS)
    try:
        manifest = read_manifest(folder)
    except CosyqError:
        return skip(GROUP, CACHE, "no usable Core ML conversion")
    compiled = settings.coreml_cache_dir / "compiled"
    states, size = [], 0
    for stage, entry in sorted(manifest.packages.items()):
        cached = compiled / entry.sha256[:HASH_PREFIX]
        hit = is_complete(cached)
        states.append(f"{stage} {'hit' if hit else 'miss'}")
        if hit:
            size += sum(f.stat().st_size for f in cached.rglob("*") if f.is_file())
    misses = sum(state.endswith("miss") for state in states)
    note = f"; {misses} compile(s) on the first load" if misses else ""
    return ok(
        GROUP,
        CACHE,
        f"{compiled}: {FAMILY_NAMES.get(manifest.family, manifest.family)} conversion, "
        f"{', '.join(states)}, {size / 1e6:.1f} MB{note}",
        misses=misses,
        size_bytes=size,
    )
