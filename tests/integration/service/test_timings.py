"""`rtf` and the stage seconds mean the same for a job run alone and one run in a batch.

`rtf` is the attempt's wall time from its start to its samples being ready, over the audio's
seconds: a batched job's time waiting for its neighbours is in it (it never reports its share
of the batched calls). The batching test engine decodes in steps of TESTENGINE_STEP_S seconds,
so every job's samples took at least its steps' wall time, alone or batched.
"""

from __future__ import annotations

import numpy as np
import pytest
import redis
from rq.job import Job

from tests.doubles.harness import Cluster, enqueue, statuses
from tests.doubles.stepped import decode_steps
from workers.engine.api import SynthesisOutput

STEP_S = 0.02  # the bounds below hold for any step; alone, six jobs take 6 x 12 steps
SPEECH_TOKENS = 50  # seconds:2 -> 2 s of audio, 50 tokens at 25 Hz
MIN_WALL_S = (SPEECH_TOKENS // 4) * STEP_S  # decode_steps of such a job, one after another


@pytest.fixture
def worker_batch_size() -> int:
    """The test sets COSYQ_BATCH_SIZE itself."""
    return 8


def results(connection: redis.Redis, batch_size: int, cluster: Cluster) -> list[dict]:
    jobs: list[Job] = [enqueue(connection, f"seconds:2 sentence {i}", seed=i) for i in range(6)]
    worker = cluster.start(
        "run",
        "--burst",
        log_name=f"b{batch_size}.log",
        COSYQ_ENGINE="tests.doubles.engines:batching",
        COSYQ_BATCH_SIZE=str(batch_size),
        TESTENGINE_STEP_S=str(STEP_S),
    )
    assert worker.wait(timeout=120) == 0
    assert statuses(connection, jobs) == ["finished"] * len(jobs)
    out = []
    for job in jobs:
        latest = job.latest_result()
        assert latest is not None and isinstance(latest.return_value, dict)
        out.append(latest.return_value)
    return out


@pytest.mark.parametrize("batch_size", [1, 8])
def test_rtf_is_the_jobs_wall_time_alone_or_batched(
    cluster: Cluster, connection: redis.Redis, batch_size: int
) -> None:
    assert decode_steps_of_a_two_second_job() * STEP_S == MIN_WALL_S
    for result in results(connection, batch_size, cluster):
        timings = result["timings"]
        wall_s = result["rtf"] * result["duration_s"]
        assert wall_s >= MIN_WALL_S  # its decode steps ran while it waited: all in its rtf
        assert wall_s <= timings["total_s"] - timings["encode_s"] - timings["store_s"] + 1e-6
        stages = sum(timings[f"{s}_s"] for s in ("frontend", "llm", "flow", "hift", "join"))
        assert stages <= wall_s + 1e-6  # the model's seconds on it never exceed its wall time


def decode_steps_of_a_two_second_job() -> int:
    return decode_steps(
        SynthesisOutput(np.zeros(0, np.float32), 24000, speech_tokens=SPEECH_TOKENS)
    )
