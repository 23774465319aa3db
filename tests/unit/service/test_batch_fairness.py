"""One tenant's jobs against the others' in a batch window: a job too long for a row leaves its
place to other jobs while it runs alone.

BatchRunner with the real books (tests/doubles/batch_rig.py) and the stepped test engine
(tests.doubles.engines:batching), on the test's private redis-server. (A text being prepared
not holding the rows back: tests/unit/engine/test_stepped_double.py.)
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from rq.job import Job

from tests.doubles.batch_rig import batch_rig
from tests.doubles.harness import wait_for
from tests.doubles.stepped import BatchingScriptedEngine
from workers.engine.requests import RequestPlan

pytestmark = pytest.mark.timeout(300)


def statuses(jobs: list[Job]) -> list[str]:
    return [job.get_status(refresh=True).value for job in jobs]


def test_jobs_too_long_for_a_row_leave_their_places_to_other_jobs(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two jobs too long for a row, held on the alone lane, in a window of two places: the
    short jobs behind them still run, in the places the long ones left (they kept them, and
    the batch sat empty until the alone lane had run both)."""
    engine = BatchingScriptedEngine()
    engine.row_steps = 20  # seconds:4 is 25 steps: alone; seconds:1 is 6
    gate = threading.Event()
    alone = engine.pipeline.synthesize_planned

    def held(plan: RequestPlan) -> object:
        assert gate.wait(120)
        return alone(plan)

    monkeypatch.setattr(engine.pipeline, "synthesize_planned", held)
    with batch_rig(redis_url, engine, tmp_path, batch_size=2) as rig:
        long = [rig.enqueue(f"seconds:4 long {i}", seed=i) for i in range(2)]
        short = [rig.enqueue(f"seconds:1 short {i}", seed=10 + i) for i in range(3)]
        window = threading.Thread(target=rig.runner.run, args=(rig.first_job(), rig.queue))
        window.start()
        try:
            wait_for(lambda: statuses(short) == ["finished"] * 3, 60, "the short jobs")
            assert statuses(long) == ["started", "started"]  # still held on the alone lane
        finally:
            gate.set()
            window.join(120)
        assert not window.is_alive()
        assert statuses(long) == ["finished", "finished"]
