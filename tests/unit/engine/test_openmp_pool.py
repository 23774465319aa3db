"""The hand-over of the model to a session's thread gives back the opener's OpenMP team."""

from __future__ import annotations

import sys
import threading

import pytest
import torch

from tests.doubles.stepped import BatchingScriptedEngine
from workers.engine import batch_session, batching
from workers.engine.batching import SequentialSession, open_batch_session
from workers.engine.openmp_pool import release_thread_team


def _parallel_op() -> torch.Tensor:
    """Large enough for at::parallel_for to open a parallel region on two threads."""
    values = torch.linspace(-4, 4, 256 * 1024).reshape(256, 1024)
    return torch.nn.functional.silu(values) * values


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="torch's libgomp is checked on Linux only"
)
def test_the_team_is_given_back_and_torch_computes_the_same_after() -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        before = _parallel_op()
        assert release_thread_team() is True  # torch's own libgomp has omp_pause_resource_all
        after = _parallel_op()  # a new team on this thread
        on_thread: list[torch.Tensor] = []
        worker = threading.Thread(target=lambda: on_thread.append(_parallel_op()))
        worker.start()
        worker.join()
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(before, after)
    assert torch.equal(before, on_thread[0])


def test_both_sessions_release_the_opening_threads_team(monkeypatch: pytest.MonkeyPatch) -> None:
    callers: list[str] = []

    def record() -> bool:
        callers.append(threading.current_thread().name)
        return True

    monkeypatch.setattr(batching, "release_thread_team", record)
    monkeypatch.setattr(batch_session, "release_thread_team", record)
    sequential = SequentialSession(BatchingScriptedEngine(), 1)
    sequential.close()
    pipeline = open_batch_session(BatchingScriptedEngine(), 2)
    assert isinstance(pipeline, batch_session.PipelineBatchSession)
    pipeline.close()
    assert callers == [threading.current_thread().name] * 2
