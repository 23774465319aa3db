"""The batching test engine (tests/doubles/stepped.py) keeps what the service's batch tests rely
on, through the production `PipelineBatchSession`: the samples a request gets alone, the most
requests that shared a step with it, a request's own error and cancel on its own future."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from shared.errors import InvalidRequestError
from tests.doubles.harness import wait_for
from tests.doubles.stepped import BatchingScriptedEngine, ScriptedPlan, decode_steps
from workers.engine.api import StopCheck, SynthesisCanceled, SynthesisInput, SynthesisOutput
from workers.engine.batch_session import PipelineBatchSession
from workers.engine.batching import SequentialSession, open_batch_session

pytestmark = pytest.mark.timeout(120)
VOICE = BatchingScriptedEngine().extract_voice(np.zeros(24000, np.float32), 24000, "a voice")


class StopAfter:
    """Says "go on" `n` times, then "stop"; counts the checks."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls > self.n


def request(text: str, seed: int, should_stop: StopCheck | None = None) -> SynthesisInput:
    return SynthesisInput(text=text, prompt=VOICE, seed=seed, should_stop=should_stop)


def test_batched_outputs_are_the_alone_ones_with_the_most_that_shared_a_step() -> None:
    engine = BatchingScriptedEngine()
    requests = [request(f"seconds:{1 + i} sentence {i}", seed=i) for i in range(3)]
    alone = [engine.synthesize(r) for r in requests]
    session = open_batch_session(engine, 3)
    assert isinstance(session, PipelineBatchSession)
    try:
        outputs = [f.result(timeout=60) for f in [session.submit(r) for r in requests]]
    finally:
        session.close()
    assert session.in_flight() == 0
    for together, single in zip(outputs, alone, strict=True):
        assert np.array_equal(together.samples, single.samples)
        assert together.speech_tokens == single.speech_tokens
        assert together.pieces == single.pieces
        assert together.seed == single.seed
        assert 1 <= together.batch_size <= 3
        assert single.batch_size == 1
        assert single.stage_seconds["llm"] >= decode_steps(single) * engine.step_s


def test_a_failing_and_a_canceled_request_leave_their_neighbour_as_alone() -> None:
    engine = BatchingScriptedEngine()
    kept = request("seconds:2 kept", seed=5)
    alone = engine.synthesize(kept)
    stop = StopAfter(3)
    session = engine.open_batch_session(3)
    try:
        futures = [
            session.submit(request("seconds:4 doomed", seed=1, should_stop=stop)),
            session.submit(request("boom", seed=2)),
            session.submit(kept),
        ]
        with pytest.raises(SynthesisCanceled):
            futures[0].result(timeout=60)
        with pytest.raises(RuntimeError, match="test engine bug"):
            futures[1].result(timeout=60)
        output = futures[2].result(timeout=60)
    finally:
        session.close()
    assert stop.calls == 4  # asked before each step, and no more once it said stop
    assert np.array_equal(output.samples, alone.samples)
    with pytest.raises(RuntimeError, match="closed"):
        session.submit(kept)


def test_a_request_being_prepared_does_not_hold_the_rows_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The front end (number spelling, splitting, tokens: ~1.2 s for a hostile 2,000-character
    text) runs beside the model thread: while one request's preparation is held, a row decodes
    to its end; a request whose preparation fails still gets its own error."""
    engine = BatchingScriptedEngine()
    entered, gate = threading.Event(), threading.Event()
    begin = engine.pipeline.begin

    def held_begin(r: SynthesisInput) -> ScriptedPlan:
        if r.text.startswith("held"):
            entered.set()
            assert gate.wait(60)
        return begin(r)

    monkeypatch.setattr(engine.pipeline, "begin", held_begin)
    session = engine.open_batch_session(3)
    try:
        row = session.submit(request("seconds:1 row", seed=1))
        wait_for(row.running, 30, "the row on the model thread", 0.005)
        held = session.submit(request("held seconds:1", seed=2))
        assert entered.wait(30)
        row.result(timeout=30)  # it decoded (25 steps) while "held" was being prepared
        assert not held.done()
        gate.set()
        assert held.result(timeout=30).seed == 2
        with pytest.raises(InvalidRequestError):
            session.submit(request("invalid", seed=3)).result(timeout=30)
    finally:
        gate.set()
        session.close()
    assert session.in_flight() == 0


def test_a_task_run_first_runs_between_steps_while_the_rows_wait() -> None:
    engine = BatchingScriptedEngine()
    session = open_batch_session(engine, 2)
    try:
        rows = [session.submit(request(f"seconds:8 row {i}", seed=i)) for i in range(2)]
        # 200 steps each: the task is taken at the next step boundary, long before they end
        seen = session.run_first(lambda: [row.done() for row in rows]).result(timeout=60)
        assert seen == [False, False]
        assert session.in_flight() == 2  # the rows, still in flight after the task
        outputs = [row.result(timeout=120) for row in rows]
    finally:
        session.close()
    assert [o.batch_size for o in outputs] == [2, 2]


def test_tasks_sent_back_to_back_take_turns_with_the_rows() -> None:
    """Streamed jobs one after another (one tenant's, each a task ahead of the rows) leave the
    rows at least half the model thread, and still run while the rows decode: each row used to
    get a few steps per task, so another tenant's batched job hardly moved while the streams
    kept coming."""
    engine = BatchingScriptedEngine()
    session = open_batch_session(engine, 2)
    seen: list[bool] = []  # per task: whether the row was done when it ran
    stop = threading.Event()

    def streams() -> None:
        while not stop.is_set():
            seen.append(session.run_first(lambda: time.sleep(0.4) or row.done()).result(60))

    row = session.submit(request("seconds:4 row", seed=0))  # 100 steps of 0.02 s
    thread = threading.Thread(target=streams, daemon=True)
    try:
        thread.start()
        row.result(timeout=60)
    finally:
        stop.set()
        thread.join(60)
        session.close()
    during = seen.count(False)
    assert 2 <= during <= 9  # ~5: 0.4 s turns each way (it was ~27: a few steps per task)


def test_the_sequential_session_runs_a_first_task_before_the_requests_still_queued() -> None:
    order: list[str] = []

    class Recording(BatchingScriptedEngine):
        def synthesize(self, request: SynthesisInput) -> SynthesisOutput:
            order.append(request.text)
            return super().synthesize(request)

    session = SequentialSession(Recording(), 1)
    try:
        futures = [session.submit(request(f"seconds:0.2 n{i}", seed=i)) for i in range(3)]
        first = session.run_first(lambda: order.append("first"))
        first.result(timeout=60)
        for future in futures:
            future.result(timeout=60)
    finally:
        session.close()
    assert order.index("first") <= 1  # after the request already running, if any
    assert [text for text in order if text != "first"] == [f"seconds:0.2 n{i}" for i in range(3)]


class SlowBatchedFlow:
    """A flow that batches: `steps` Euler steps per `mels` call, `step_s` each, calling
    `between_steps` after each but the last as the torch flow does. It holds its first step
    until `hold` is set, so a test can hand the session a task while the call is running."""

    name = "slow-batched"
    batches = True

    def __init__(self, steps: int = 10, step_s: float = 0.01) -> None:
        self.steps, self.step_s = steps, step_s
        self.started, self.hold = threading.Event(), threading.Event()
        self.steps_done = 0
        self.calls = 0

    def mels(self, pieces, *, between_steps=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        self.steps_done = 0
        self.started.set()
        assert self.hold.wait(60)
        for step in range(1, self.steps + 1):
            time.sleep(self.step_s)
            self.steps_done = step
            if step < self.steps and between_steps is not None:
                between_steps()
        return [np.zeros((80, 2), np.float32) for _ in pieces]


def test_a_task_run_first_runs_inside_a_batched_flow_call_and_is_not_the_rows_flow_time() -> None:
    engine = BatchingScriptedEngine()
    flow = SlowBatchedFlow()
    engine.pipeline.flow = flow  # type: ignore[assignment]
    session = open_batch_session(engine, 2)
    task_s = 3.0
    try:
        # hold the model thread in a task until both rows are prepared and waiting for it, so
        # they are admitted at one boundary and finish their decode in the same step: their
        # flow is one `mels` call
        assert isinstance(session, PipelineBatchSession)

        def waiting() -> bool:  # on the model thread: its own move of what the preparation
            session._take(block=False)  # thread handed it (one group or two, before or now)
            return len(session._waiting) >= 2

        holding = session.run_first(lambda: wait_for(waiting, 60, "both rows prepared", 0.005))
        rows = [session.submit(request(f"seconds:0.2 row {i}", seed=i)) for i in range(2)]
        holding.result(timeout=60)
        assert flow.started.wait(60)

        def inside() -> tuple[int, list[bool]]:
            time.sleep(task_s)
            return flow.steps_done, [row.done() for row in rows]

        task = session.run_first(inside)
        flow.hold.set()
        steps_seen, rows_done = task.result(timeout=60)
        outputs = [row.result(timeout=60) for row in rows]
    finally:
        session.close()
    assert flow.calls == 1
    assert 1 <= steps_seen < flow.steps  # between two Euler steps of the rows' call
    assert rows_done == [False, False]
    for output in outputs:  # each row's share of the call, the task's seconds taken out
        assert output.stage_seconds["flow"] < task_s / 2
