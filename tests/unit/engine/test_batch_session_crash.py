"""The batch session's model loop itself failing (the scripted double of tests/doubles/stepped.py,
its decoder a failing one): every job settles with the loop's error, those still being
prepared on `cosyq-model-prepare` or queued behind them included, and new work is refused.

Before, the crash settled the rows, the waiting and the queued jobs only: a job whose front end
was still running (or queued for it) was handed to a queue nobody read, its future never done.
Nothing here waits on a clock: each step waits on the event that the one before it set.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.doubles.crashing import WAIT_S, CrashingDecoder, DeviceLost
from tests.doubles.stepped import BatchingScriptedEngine, ScriptedPipeline, ScriptedPlan
from workers.engine.api import SynthesisInput
from workers.engine.batch_session import PipelineBatchSession

VOICE = BatchingScriptedEngine().extract_voice(np.zeros(24000, np.float32), 24000, "a voice")
HELD = "Held in preparation."


def request(text: str, seed: int) -> SynthesisInput:
    return SynthesisInput(text=text, prompt=VOICE, seed=seed)


class HeldPipeline(ScriptedPipeline):
    """The scripted front end, where HELD waits for `release` (`preparing` set meanwhile)."""

    def __init__(self, engine: BatchingScriptedEngine) -> None:
        super().__init__(engine)
        self.preparing = threading.Event()
        self.release = threading.Event()

    def begin(self, request: SynthesisInput) -> ScriptedPlan:
        if request.text == HELD:
            self.preparing.set()
            assert self.release.wait(WAIT_S)
        return super().begin(request)


def test_a_crashed_loop_settles_the_jobs_still_in_preparation_and_refuses_new_work() -> None:
    engine = BatchingScriptedEngine()
    pipeline = HeldPipeline(engine)
    # its first step waits until a job is held in preparation and another queued behind it
    # (`crash`, set by the test once both are in), then the device is lost
    crash = threading.Event()
    decoder = CrashingDecoder(4, 0.0, crash_at=1, stepping=threading.Event(), go=crash)
    session = PipelineBatchSession(pipeline, decoder, 4)
    try:
        decoding = session.submit(request("On a row.", 1))
        assert decoder.stepping.wait(WAIT_S)  # its row is in the step that will fail
        held = session.submit(request(HELD, 2))
        assert pipeline.preparing.wait(WAIT_S)  # its front end is running
        behind = session.submit(request("Queued behind it.", 3))
        crash.set()
        assert isinstance(decoding.exception(WAIT_S), DeviceLost)  # the loop has failed
        pipeline.release.set()  # the held front end ends after the crash
        for future in (held, behind):
            assert isinstance(future.exception(WAIT_S), DeviceLost)
        with pytest.raises(RuntimeError, match="model thread failed"):
            session.submit(request("After the crash.", 4))
        with pytest.raises(RuntimeError, match="model thread failed"):
            session.run_first(lambda: None)
    finally:
        pipeline.release.set()
        session.close()
    assert session.in_flight() == 0
