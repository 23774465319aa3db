"""The compiled-model cache: once per package hash, locked across processes, crash-safe."""

from __future__ import annotations

import multiprocessing
import shutil
import time
from pathlib import Path

import pytest

from shared.errors import ModelLoadError
from workers.coreml.cache import COMPLETE_MARKER, compiled_model_path, exclusive_lock

HASH = "ab" * 32


class CountingCompiler:
    """Stands in for coremltools' compile: copies the package and logs one line per call."""

    def __init__(self, log: Path, seconds: float = 0.0) -> None:
        self.log = log
        self.seconds = seconds

    def __call__(self, package: Path, destination: Path) -> Path:
        with self.log.open("a") as f:
            f.write(f"{package.name}\n")
        time.sleep(self.seconds)
        shutil.copytree(package, destination)
        return destination


def make_package(tmp_path: Path) -> Path:
    package = tmp_path / "flow_cfm.mlpackage"
    package.mkdir()
    (package / "Manifest.json").write_text("{}")
    return package


def compile_in_child(package: str, cache: str, log: str) -> None:
    compiled_model_path(Path(package), HASH, Path(cache), CountingCompiler(Path(log), 2.0))


def test_compiles_once_then_reuses_the_compiled_model(tmp_path: Path) -> None:
    package, log = make_package(tmp_path), tmp_path / "compiles.log"
    first = compiled_model_path(package, HASH, tmp_path / "cache", CountingCompiler(log))
    second = compiled_model_path(package, HASH, tmp_path / "cache", CountingCompiler(log))
    assert first == second == tmp_path / "cache" / "compiled" / HASH[:32] / "flow_cfm.mlmodelc"
    assert (first / "Manifest.json").is_file()
    assert log.read_text().splitlines() == ["flow_cfm.mlpackage"]


def test_two_processes_starting_together_compile_once(tmp_path: Path) -> None:
    package, log, cache = make_package(tmp_path), tmp_path / "compiles.log", tmp_path / "cache"
    context = multiprocessing.get_context("spawn")
    children = [
        context.Process(target=compile_in_child, args=(str(package), str(cache), str(log)))
        for _ in range(2)
    ]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=60)
        assert child.exitcode == 0
    assert log.read_text().splitlines() == ["flow_cfm.mlpackage"]


def test_a_failed_compile_leaves_nothing_that_looks_compiled(tmp_path: Path) -> None:
    package, cache = make_package(tmp_path), tmp_path / "cache"

    def crash(_package: Path, destination: Path) -> None:
        destination.mkdir()
        raise RuntimeError("compiler crashed")

    with pytest.raises(RuntimeError, match="compiler crashed"):
        compiled_model_path(package, HASH, cache, crash)
    assert not list((cache / "compiled").iterdir())
    log = tmp_path / "compiles.log"
    compiled = compiled_model_path(package, HASH, cache, CountingCompiler(log))
    assert (compiled.parent / COMPLETE_MARKER).read_text().strip() == HASH


def test_waiting_too_long_for_another_compile_is_a_clear_error(tmp_path: Path) -> None:
    package, cache = make_package(tmp_path), tmp_path / "cache"
    with (
        exclusive_lock(cache / "locks" / f"{HASH[:32]}.lock", timeout_s=1),
        pytest.raises(ModelLoadError, match="another process has been compiling"),
    ):
        compiled_model_path(
            package, HASH, cache, CountingCompiler(tmp_path / "log"), lock_timeout_s=0.3
        )
