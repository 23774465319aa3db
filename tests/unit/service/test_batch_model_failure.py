"""A batch window whose session's model thread fails: every job it admitted gets an outcome.

BatchRunner with the real books (tests/doubles/batch_rig.py) over the real batch session, its
scripted decoder failing for good (tests/doubles/crashing.py), on the test's private
redis-server. The job on the model when it failed keeps the failure's error (as the session
settles it); the jobs the window had admitted and not yet handed to the session fail with
`WorkerModelFailedError`, which the worker retries (they did nothing wrong); a job popped and
not started goes back to its queue's head (or was never popped); the window says the worker
must retire. Before, the window's next `submit` raised out of it (and out of
the worker) with those jobs unrecorded.

Nothing here waits on a clock: the window's thread is held at the moments the test needs (its
gate's `on_room`), and the crash waits for the test's `go`.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from rq.job import Job
from rq.registry import StartedJobRegistry
from rq.results import Result

from shared import keys
from shared.errors import WorkerModelFailedError
from tests.doubles.batch_rig import OpenGate, batch_rig
from tests.doubles.crashing import WAIT_S, CrashingBatchEngine, DeviceLost
from tests.doubles.stepped import BatchingScriptedEngine
from workers.engine.api import SynthesisInput
from workers.service.batch_runner import BatchRunner
from workers.service.failures import classify
from workers.service.streamed_first import StreamedFirst

UNSUBMITTED = "this worker's model failed before the job ran on it"


class Holds:
    """The window's thread, asking its gate for room, held twice: once its first job is on the
    crashing step (`first`), then once three jobs are admitted (`second`)."""

    def __init__(self, engine: CrashingBatchEngine) -> None:
        self.engine = engine
        self.runner: BatchRunner | None = None
        self.first, self.second = threading.Event(), threading.Event()
        self.release_first, self.release_second = threading.Event(), threading.Event()

    def on_room(self) -> None:
        assert self.runner is not None
        if self.engine.stepping.is_set() and not self.first.is_set():
            self.first.set()
            assert self.release_first.wait(WAIT_S)
        elif len(self.runner.jobs) >= 3 and not self.second.is_set():
            self.second.set()
            assert self.release_second.wait(WAIT_S)


def test_a_failed_model_thread_leaves_every_job_of_the_window_recorded_or_queued(
    redis_url: str, tmp_path: Path
) -> None:
    go = threading.Event()
    engine = CrashingBatchEngine(go=go)
    holds = Holds(engine)
    outcome: list[bool] = []
    gate = OpenGate(holds.on_room)
    # RQ's own SimpleWorker records here, and no retry (its failed Result keeps each error):
    # the worker's classification and retries are tests/integration/service/'s, same name
    with batch_rig(redis_url, engine, tmp_path / "w1", gate=gate, max_retries=0) as rig:
        holds.runner = rig.runner
        on_row = rig.enqueue("seconds:2 on its row", seed=1)
        first = rig.first_job()
        window = threading.Thread(target=lambda: outcome.append(rig.runner.run(first, rig.queue)))
        window.start()
        try:
            assert holds.first.wait(WAIT_S)  # its row is on the step that will fail
            # popped together once the window goes on, admitted, and held before their submit
            admitted = [rig.enqueue(f"seconds:1 admitted {i}", seed=2 + i) for i in range(2)]
            holds.release_first.set()
            assert holds.second.wait(WAIT_S)
            queued = rig.enqueue("seconds:1 still queued", seed=4)  # popped, or left queued
            go.set()  # the model thread fails, and its clear too: the loop itself fails
            row = rig.runner.jobs[on_row.id].future
            assert row is not None and row.exception(WAIT_S) is not None
        finally:
            go.set()
            holds.release_first.set()
            holds.release_second.set()
            window.join(WAIT_S)
        assert outcome == [False]  # the worker retires
        assert "DeviceLost: the device is gone" in failure(on_row)  # the session's error
        for job in admitted:
            assert failure(job).endswith(f"WorkerModelFailedError: {UNSUBMITTED}\n"), job.id
            assert job.meta[keys.ATTEMPT_META_KEY] == 1
        queued.refresh()
        assert queued.get_status() == "queued" and keys.ATTEMPT_META_KEY not in queued.meta
        in_queue = [raw.decode() for raw in rig.connection.lrange(rig.queue.key, 0, -1)]
        assert in_queue[0] == queued.id  # never started: back at (or still at) the head
        assert in_queue == [queued.id]
        assert len(StartedJobRegistry(rig.queue.name, connection=rig.connection)) == 0
        assert len(rig.ends) == 3  # each recorded job counted once for recycling
    # the next worker, its model sound, runs the job the failed one left in its queue
    with batch_rig(redis_url, BatchingScriptedEngine(), tmp_path / "w2") as next_rig:
        assert next_rig.runner.run(next_rig.first_job(), next_rig.queue)
        assert queued.get_status() == "finished"


def failure(job: Job) -> str:
    """The failed attempt's error as RQ recorded it."""
    job.refresh()
    assert job.get_status() == "failed", job.id
    result = job.latest_result()
    assert result is not None and result.type == Result.Type.FAILED, job.id
    return result.exc_string or ""


def test_a_job_the_failed_session_never_took_is_retried_as_transient() -> None:
    error = classify(WorkerModelFailedError())
    assert (error.kind, error.retryable, error.message) == ("transient", True, UNSUBMITTED)


def test_a_streamed_job_or_a_resynthesis_the_failed_session_never_took_is_retryable(
    redis_url: str, tmp_path: Path
) -> None:
    engine = CrashingBatchEngine()
    with batch_rig(redis_url, engine, tmp_path) as rig:
        rig.runner.start_session()
        session = rig.runner.session
        assert session is not None
        voice = engine.extract_voice(np.zeros(24000, np.float32), 24000, "a voice")
        request = SynthesisInput(text="seconds:1 on the failing step", prompt=voice, seed=1)
        assert isinstance(session.submit(request).exception(WAIT_S), DeviceLost)
        assert session.failed()
        streamed = StreamedFirst(engine, session, owned=lambda: True, claim_store=lambda: True)
        with pytest.raises(WorkerModelFailedError):
            streamed.synthesize(request)
        with pytest.raises(WorkerModelFailedError):
            rig.runner._resynthesize(request)
