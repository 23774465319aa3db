"""The reference set's tiny flow for the streaming-cache tests, in fewer Euler steps.

What those tests check (a cached or primed stream gives the recompute's mel, its bytes stay
bounded) holds step by step: each step keeps its own cache and the steps run alike, so two
steps check it as ten do, in a fifth of the estimator passes. bf16 tests keep the reference's
steps: their bounds (SNR) were set on the error ten steps accumulate.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from workers.model.checkpoint import read_state_dict
from workers.model.flow.model import CausalMaskedDiffWithXvec, build_flow
from workers.tools.reference.configs import flow_config_from_reference
from workers.tools.reference.parity import ReferenceSet

STREAM_TEST_STEPS = 2  # >1: a step's cache is not the only one


def reference_flow(reference_dir: Path, steps: int | None = None) -> CausalMaskedDiffWithXvec:
    """The set's tiny flow (float32), in `steps` Euler steps (None: the set's own)."""
    ref = ReferenceSet(reference_dir)
    config = flow_config_from_reference(ref.config, "tiny")
    if steps is not None:
        config = config.with_steps(steps)
    path = ref.checkpoint("flow")
    return build_flow(config, read_state_dict(path), source=path)


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Two OpenMP threads on a crowded 2-core machine: ~15x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(scope="module", name="flow")
def stream_test_flow(reference_dir: Path) -> Iterator[CausalMaskedDiffWithXvec]:
    """In STREAM_TEST_STEPS Euler steps (the docstring above says why that suffices)."""
    with one_torch_thread():
        yield reference_flow(reference_dir, STREAM_TEST_STEPS)


@pytest.fixture(scope="module", name="reference_steps_flow")
def reference_steps_flow_fixture(reference_dir: Path) -> Iterator[CausalMaskedDiffWithXvec]:
    """In the reference's own steps, for the bf16 bounds."""
    with one_torch_thread():
        yield reference_flow(reference_dir)
