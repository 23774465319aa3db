"""A batch window riding out what used to end it: a Redis blip at a refusal, a blocked thread.

BatchRunner with the real books (tests/doubles/batch_rig.py) and the stepped test engine
(tests.doubles.engines:batching), on the test's private redis-server.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from structlog.testing import capture_logs

from shared import keys
from tests.doubles.batch_rig import OpenGate, batch_rig
from tests.doubles.stepped import BatchingScriptedEngine


class BlipAtRefusal(redis.Redis):
    """A real client whose first refusal write (the pipeline that adds to the failed registry)
    drops once."""

    blips = 1

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        real = pipe.execute

        def execute(*args: Any, **kwargs: Any) -> Any:
            failing = any(
                args[0] == "ZADD" and "failed" in str(args[1]) for args, _ in pipe.command_stack
            )
            if type(self).blips and failing:
                type(self).blips -= 1
                pipe.reset()
                raise redis.ConnectionError("test: connection dropped during the refusal")
            return real(*args, **kwargs)

        pipe.execute = execute  # type: ignore[method-assign]
        return pipe


@pytest.fixture
def engine() -> BatchingScriptedEngine:
    return BatchingScriptedEngine(name="test-batching")


def test_a_redis_blip_at_a_refusal_inside_the_window_ends_nothing(
    redis_url: str, engine: BatchingScriptedEngine, tmp_path: Path
) -> None:
    blipping = BlipAtRefusal.from_url(redis_url)
    with batch_rig(redis_url, engine, tmp_path, worker_connection=blipping) as rig:
        first = rig.enqueue("seconds:2 first", seed=1)
        foreign = rig.queue.enqueue("os.getcwd")  # refused: not one of cosyq's job functions
        later = rig.enqueue("seconds:1 later", seed=2)
        rig.runner.run(rig.first_job(), rig.queue)
        assert [j.get_status(refresh=True) for j in (first, foreign, later)] == [
            "finished",
            "failed",
            "finished",
        ]
        assert BlipAtRefusal.blips == 0  # the refusal did meet the blip, and waited it out
    blipping.close()


def test_a_row_that_finished_while_the_thread_was_blocked_is_not_judged_late(
    redis_url: str, engine: BatchingScriptedEngine, tmp_path: Path
) -> None:
    blocked: list[bool] = []

    def block_once_the_row_is_on_the_model() -> None:
        runner = made.runner
        if not blocked and any(e.future is not None for e in runner.jobs.values()):
            blocked.append(True)
            time.sleep(1.5)  # an outage, a push-back: the row finishes meanwhile

    with batch_rig(
        redis_url, engine, tmp_path, gate=OpenGate(on_room=block_once_the_row_is_on_the_model)
    ) as made:
        job = made.enqueue("seconds:0.5 quick", seed=1, job_timeout=1)
        made.runner.run(made.first_job(), made.queue)
        assert blocked == [True]
        job.refresh()
        assert job.get_status() == "finished"
        assert keys.LAST_ERROR_META_KEY not in job.meta


@pytest.fixture(autouse=True)
def reset_blips() -> Iterator[None]:
    BlipAtRefusal.blips = 1
    yield


def test_most_in_flight_is_each_window_s_own(
    redis_url: str, engine: BatchingScriptedEngine, tmp_path: Path
) -> None:
    with batch_rig(redis_url, engine, tmp_path) as rig, capture_logs() as logs:
        for i in range(3):
            rig.enqueue(f"seconds:8 together {i}", seed=i)  # 1 s on the model: all admitted
        rig.runner.run(rig.first_job(), rig.queue)
        rig.enqueue("seconds:1 alone", seed=9)
        rig.runner.run(rig.first_job(), rig.queue)
    windows = [e for e in logs if e["event"] == "batch_window_closed"]
    assert [(w["jobs"], w["most_in_flight"]) for w in windows] == [(3, 3), (1, 1)]
