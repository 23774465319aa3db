"""The engine's chunked streaming flow reproduces the reference streaming arrays, hop by hop,
including the partly full last chunk; and a check that would catch a wrong schedule."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from workers.engine.streaming import StreamSchedule
from workers.tools.reference.flow import REFERENCE_FILE, load_reference_flow
from workers.tools.reference.parity import ReferenceSet
from workers.tools.reference.streaming import check_streaming, chunked_mels


@pytest.fixture(scope="module")
def ref(reference_dir: Path) -> Iterator[ReferenceSet]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # two OpenMP threads on a crowded 2-core machine: ~15x slower
    yield ReferenceSet(reference_dir)
    torch.set_num_threads(before)


def test_chunked_mel_matches_both_streaming_arrays(ref: ReferenceSet) -> None:
    checks = check_streaming(ref)
    assert [c.name for c in checks] == [
        "stream_chunks:mel_stream_finalize",
        "stream_chunks:mel_stream_nofinalize",
    ]
    assert all(c.passed for c in checks), checks
    assert all(c.tolerance <= 1e-3 for c in checks)


def test_a_misaligned_schedule_differs_from_the_one_pass_mel(ref: ReferenceSet) -> None:
    """Hops off the chunk edges see fewer keys at the chunk's end: the comparison catches it."""
    arrays = ref.arrays(REFERENCE_FILE)
    mels, tokens = chunked_mels(load_reference_flow(ref), arrays, StreamSchedule(first_hop=3))
    assert tokens[0] == 15 and sum(tokens) == 40
    whole = np.concatenate(mels, axis=1)[None]
    assert whole.shape == arrays["mel_stream_finalize"].shape
    assert np.abs(whole - arrays["mel_stream_finalize"]).max() > 1e-2
