"""One tenant's jobs against the others' in a batch window: a job too long for a row leaves its
place to other jobs while it runs alone, and a job past its deadline stops decoding (as a
row, alone or streamed).

BatchRunner with the real books (tests/doubles/batch_rig.py) and the stepped test engine
(tests.doubles.engines:batching), on the test's private redis-server. (A text being prepared
not holding the rows back: tests/unit/engine/test_stepped_double.py.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from rq.job import Job

from tests.doubles.batch_rig import batch_rig
from tests.doubles.harness import wait_for
from tests.doubles.stepped import BatchingScriptedEngine, SteppedDecoder
from workers.engine.api import SynthesisCanceled, SynthesisOutput
from workers.engine.requests import RequestPlan
from workers.model.llm.batch import FinishedRow

pytestmark = pytest.mark.timeout(300)


def statuses(jobs: list[Job]) -> list[str]:
    return [job.get_status(refresh=True).value for job in jobs]


@pytest.fixture
def finished_rows(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The text of every row that decoded to its end."""
    seen: list[str] = []
    step = SteppedDecoder.step

    def recording(self: SteppedDecoder) -> list[FinishedRow]:
        finished = step(self)
        seen.extend(row.key.request.text for row in finished)  # type: ignore[attr-defined]
        return finished

    monkeypatch.setattr(SteppedDecoder, "step", recording)
    yield seen


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


def test_a_row_past_its_deadline_stops_decoding_and_the_others_go_on(
    redis_url: str, tmp_path: Path, finished_rows: list[str]
) -> None:
    """The row fails as timed out (as the timeout path records it) and leaves the batch at
    its next step: it used to decode its 375 steps to the end for nothing."""
    engine = BatchingScriptedEngine()  # 0.02 s a step: the doomed row needs 7.5 s at least
    with batch_rig(redis_url, engine, tmp_path, batch_size=2, max_retries=0) as rig:
        doomed = rig.enqueue("seconds:60 doomed", seed=1, job_timeout=2)
        kept = rig.enqueue("seconds:4 kept", seed=2)
        rig.runner.run(rig.first_job(), rig.queue)
        session = rig.runner.session
        assert session is not None
        wait_for(lambda: session.in_flight() == 0, 60, "the model thread to be idle")
        assert statuses([doomed, kept]) == ["failed", "finished"]
        failure = doomed.latest_result()  # the timeout path's record (the worker's own
        assert failure is not None and failure.exc_string is not None  # handler adds its meta)
        assert "JobTimeoutException: Task exceeded maximum timeout value (2 seconds)" in (
            failure.exc_string
        )
        stored = sorted(path.name for path in rig.out.rglob("*") if path.is_file())
        kept_audio = [f".{kept.id}.wav.cosyq.json", f"{kept.id}.wav"]  # with its note
        assert stored == kept_audio, stored  # no audio of the doomed row
    assert finished_rows == ["seconds:4 kept"]  # the doomed row never decoded to its end


@pytest.mark.parametrize("lane", ["alone", "streamed"])
def test_a_job_run_alone_or_streamed_stops_at_its_deadline(
    lane: str, redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Too long for a row (alone lane) or streamed (ahead of the rows): past its deadline the
    job fails as timed out and its synthesis stops at its next LLM step, not at its end."""
    engine = BatchingScriptedEngine()
    engine.row_steps = 20  # the doomed job's 375 steps: alone; the kept one's 6: a row
    ends: list[str] = []
    planned = engine.pipeline.synthesize_planned

    def recording(plan: RequestPlan) -> SynthesisOutput:
        try:
            output = planned(plan)
        except SynthesisCanceled:
            ends.append("stopped")
            raise
        ends.append("decoded to its end")
        return output

    monkeypatch.setattr(engine.pipeline, "synthesize_planned", recording)
    with batch_rig(redis_url, engine, tmp_path, batch_size=2, max_retries=0) as rig:
        streamed = {"stream": True} if lane == "streamed" else {}
        doomed = rig.enqueue("seconds:60 doomed", seed=1, job_timeout=2, **streamed)
        kept = rig.enqueue("seconds:1 kept", seed=2)
        rig.runner.run(rig.first_job(), rig.queue)
        session = rig.runner.session
        assert session is not None
        wait_for(lambda: session.in_flight() == 0, 60, "the model thread to be idle")
        assert statuses([doomed, kept]) == ["failed", "finished"]
        failure = doomed.latest_result()
        assert failure is not None and "JobTimeoutException" in str(failure.exc_string)
    assert ends == ["stopped"]
