"""BatchRunner with the real engine's BatchSession (tiny model, cpu, fp32) and the real books.

No worker process and no test engine (tests/doubles/batch_rig.py). Checked: jobs share the
model, each ends finished in RQ's registries with its heartbeat dropped and its recycling count;
a job that cannot join (add_voice) goes back to its queue's head at once, a streamed one runs in
the window ahead of the rows; a row expired before its store never stores.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from rq.registry import FinishedJobRegistry, StartedJobRegistry

from shared import keys
from tests.doubles.batch_rig import QUEUE, Rig, batch_rig
from workers.engine.pipeline import EngineOptions, SynthesisPipeline, build_engine
from workers.service.attempts import Attempt
from workers.service.batch_rows import BatchJob

pytestmark = pytest.mark.timeout(600)  # the tiny model on shared, loaded cores
FORCED_TOKENS = 20  # per piece: the random tiny LLM would otherwise run to its cap


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> SynthesisPipeline:
    options = EngineOptions(forced_speech_tokens=FORCED_TOKENS)
    return build_engine(
        tiny_model_dir, device="cpu", options=options, hash_cache_dir=tmp_path_factory.mktemp("h")
    )


@pytest.fixture
def rig(redis_url: str, engine: SynthesisPipeline, tmp_path: Path) -> Iterator[Rig]:
    with batch_rig(redis_url, engine, tmp_path) as made:
        yield made


def test_jobs_share_the_real_session_and_each_is_kept_whole(rig: Rig) -> None:
    jobs = [rig.enqueue(f"sentence number {i}.", seed=i) for i in range(4)]
    rig.runner.run(rig.first_job(), rig.queue)
    for job in jobs:
        job.refresh()
        assert job.get_status() == "finished"
        assert job.meta[keys.ATTEMPT_META_KEY] == 1
        assert rig.connection.exists(keys.job_heartbeat_key(job.id)) == 0
    sizes = [job.latest_result().return_value["batch_size"] for job in jobs]  # type: ignore[union-attr]
    assert max(sizes) >= 2, sizes
    assert sorted(FinishedJobRegistry(QUEUE, connection=rig.connection).get_job_ids()) == sorted(
        job.id for job in jobs
    )
    assert len(StartedJobRegistry(QUEUE, connection=rig.connection)) == 0
    assert len(rig.ends) == 4 and rig.ends[-1] is True  # the last one left the model idle


def test_a_job_that_cannot_join_goes_back_to_the_head_of_its_queue_at_once(rig: Rig) -> None:
    batched = rig.enqueue("a batched sentence.", seed=1)
    voice = rig.queue.enqueue(
        "workers.tasks.add_voice", name="v", prompt_audio=str(rig.out / "none.wav")
    )
    later = rig.enqueue("a later sentence.", seed=2)
    rig.runner.run(rig.first_job(), rig.queue)
    batched.refresh()
    assert batched.get_status() == "finished"
    queued = [raw.decode() for raw in rig.connection.lrange(rig.queue.key, 0, -1)]
    assert queued[0] == voice.id and set(queued) <= {voice.id, later.id}
    assert voice.get_status() == "queued"


def test_a_streamed_job_popped_during_the_window_runs_in_it_ahead_of_the_rows(rig: Rig) -> None:
    batched = [rig.enqueue(f"batched sentence {i}.", seed=i) for i in range(2)]
    streamed = rig.enqueue("a streamed sentence.", stream=True, seed=5)
    rig.runner.run(rig.first_job(), rig.queue)
    for job in [*batched, streamed]:
        job.refresh()
        assert job.get_status() == "finished", job.id
        assert job.meta[keys.ATTEMPT_META_KEY] == 1
    assert rig.connection.llen(rig.queue.key) == 0  # it ran in the window, not after it
    result = streamed.latest_result().return_value  # type: ignore[union-attr]
    assert result["stream"] == keys.audio_stream_key(streamed.id)
    entries = rig.connection.xrange(result["stream"])
    assert entries and entries[-1][1][b"final"] == b"1"
    assert result["timings"]["first_chunk_s"] is not None
    assert len(rig.ends) == 3


def test_a_row_expired_before_its_store_stores_nothing_and_one_being_stored_is_not_expired(
    rig: Rig,
) -> None:
    job = rig.enqueue("one.")
    expired = BatchJob(Attempt(job, rig.queue))
    assert expired.expire() and not expired.claim_store()
    storing = BatchJob(Attempt(job, rig.queue))
    assert storing.claim_store() and not storing.expire()
