"""The hand-over of the model to a session's thread gives back the opener's OpenMP team."""

from __future__ import annotations

import sys
import threading
import time

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
    opener = threading.current_thread().name
    assert callers.count(opener) == 2  # each session's opener, in its __init__
    assert set(callers) <= {opener, "cosyq-model"}  # and an idle model thread, before it waits


@pytest.mark.parametrize("kind", ["sequential", "pipeline"])
def test_an_idle_model_thread_gives_its_team_back_before_it_waits(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batching worker runs a job that cannot join (a streamed or add_voice job while no
    window is open) on its main thread: the model thread's parked team must not slow it."""
    callers: list[str] = []

    def record() -> bool:
        callers.append(threading.current_thread().name)
        return True

    monkeypatch.setattr(batching, "release_thread_team", record)
    monkeypatch.setattr(batch_session, "release_thread_team", record)

    def model_releases(count: int) -> bool:
        deadline = time.monotonic() + 60
        while callers.count("cosyq-model") < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return callers.count("cosyq-model") >= count

    engine = BatchingScriptedEngine()
    session = (
        SequentialSession(engine, 1) if kind == "sequential" else open_batch_session(engine, 2)
    )
    try:
        assert model_releases(1)  # idle from the start
        done = callers.count("cosyq-model")
        session.run_first(lambda: torch.ones(4).sum()).result(timeout=60)
        assert model_releases(done + 1)  # idle again after a task
    finally:
        session.close()
