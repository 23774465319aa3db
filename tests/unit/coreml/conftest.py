"""Fixtures: one torch thread, micro model directories (CosyVoice 2 and 3) and their
conversions (once per session each).

Conversion is the slow part of these tests, so one session-scoped fixture converts the micro
model once (fp16, flexible lengths, FLOW_STEPS Euler steps) through the `cosyq-worker convert`
command and every test reads that folder. Under pytest-xdist the test processes share it: the
first to need it converts under a file lock in the run's common temp folder, the others wait
and read it.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests.doubles.mil_interpreter import PackagePrograms
from tests.unit.coreml.micro import (
    FLOW_STEPS,
    Converted,
    write_micro3_model_dir,
    write_micro_model_dir,
)
from workers.cli import main as worker_cli
from workers.coreml.manifest import read_manifest

# Marks a finished micro model folder. Rewriting it would truncate checkpoints that another
# test process has memory-mapped (a SIGBUS, or NaN weights mid-conversion).
MODEL_WRITTEN = ".written"
CONVERSION_TIMEOUT_S = 600  # the first test to use `converted` pays for the conversion


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The session conversion (~45 s alone, minutes beside a parallel suite) runs in the
    setup of whichever test needs it first: that test gets the conversion's time limit."""
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(CONVERSION_TIMEOUT_S))


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread for these tests (restored after them): on the shared 2-core machine
    two threads stalled each other's parallel regions (8 s instead of 0.03 s per micro flow)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@contextlib.contextmanager
def shared_folder(tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Path]:
    """A folder every test process of this run sees, held under an exclusive lock meanwhile
    (xdist gives each process its own basetemp below one common parent)."""
    common = tmp_path_factory.getbasetemp().parent
    if "PYTEST_XDIST_WORKER" not in os.environ:
        common = tmp_path_factory.getbasetemp()
    with open(common / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield common / name
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def write_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, write: Callable[[Path], Path]
) -> Path:
    """A model folder `write` fills once per run, shared by the test processes."""
    with shared_folder(tmp_path_factory, name) as folder:
        written = folder / MODEL_WRITTEN
        if not written.exists():
            folder.mkdir(exist_ok=True)
            write(folder)
            written.touch()  # last: never write again, another process may have it mapped
        return folder


@pytest.fixture(scope="session")
def micro_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_once(tmp_path_factory, "micro-model", write_micro_model_dir)


@pytest.fixture(scope="session")
def micro3_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The CosyVoice 3 micro model (DiT flow, causal HiFT)."""
    return write_once(tmp_path_factory, "micro3-model", write_micro3_model_dir)


def convert_once(
    micro_model_dir: Path, tmp_path_factory: pytest.TempPathFactory, name: str, *flags: str
) -> Converted:
    """`cosyq-worker convert MICRO OUT *flags` once per run into the shared folder `name`."""
    with shared_folder(tmp_path_factory, name) as out_dir:
        printed_file = out_dir.with_suffix(".printed")
        if not printed_file.exists():
            out_dir.mkdir(exist_ok=True)
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                status = worker_cli(["convert", str(micro_model_dir), str(out_dir), *flags])
            assert status == 0, printed.getvalue()
            printed_file.write_text(printed.getvalue())
        return Converted(micro_model_dir, out_dir, read_manifest(out_dir), printed_file.read_text())


@pytest.fixture(scope="session")
def converted(micro_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Converted:
    """The micro model converted once per run: fp16, no weight compression, flexible lengths,
    the CFM in FLOW_STEPS Euler steps (compare it with a torch flow of as many steps)."""
    return convert_once(
        micro_model_dir, tmp_path_factory, "micro-coreml", "--flow-steps", str(FLOW_STEPS)
    )


@pytest.fixture(scope="session")
def converted3(micro3_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Converted:
    """The CosyVoice 3 micro model converted once per run, with the options of `converted`
    (the default batch sizes: the batched DiT encoder is what the runtime calls)."""
    return convert_once(
        micro3_model_dir, tmp_path_factory, "micro3-coreml", "--flow-steps", str(FLOW_STEPS)
    )


@pytest.fixture(scope="session")
def converted_programs(converted: Converted) -> PackagePrograms:
    """The MIL programs of `converted`'s packages, each loaded once per test process (~1 s for
    the batched encoder) for every test that interprets or decompresses them."""
    return PackagePrograms(converted.out_dir)
