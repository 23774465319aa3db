"""COSYQ_BATCH_SIZE=8 with the real engine (tiny model, cpu, fp32): 24 seeded jobs through the
queue batch together, and each result's audio is the one the same job gets run alone.

The engine is `tests.doubles.engines:tiny_as_configured`: the default engine's torch path with
its choices for this host (dtype, auto LLM precision), only its flow in 2 Euler steps, not 10.
Both runs solve the same steps, so each job alone is still the reference; the batched flow still
runs its padded, masked call at every step (a padding error shows in step 1), and the LLM's
batched decode is unchanged. The 8 fewer flow steps per piece were a third of this file's CPU."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import pytest
import redis
import soundfile as sf
from rq.job import Job

from tests.doubles.harness import Cluster, enqueue, statuses

pytestmark = pytest.mark.timeout(1200)  # two worker loads and 48 tiny-model jobs, busy cores
JOBS = 24
MAX_ABS = 1e-4


@pytest.fixture
def worker_batch_size() -> int:
    """These tests set COSYQ_BATCH_SIZE themselves: run each once."""
    return 8


def result(job: Job) -> dict:
    found = job.latest_result()
    assert found is not None and isinstance(found.return_value, dict)
    return found.return_value


def run_jobs(cluster: Cluster, connection: redis.Redis, batch_size: int) -> list[Job]:
    texts = ["hello there.", "a somewhat longer sentence to say.", "one, two, three."]
    jobs = [
        enqueue(
            connection,
            texts[i % 3],
            seed=7 + i,
            speed=(1.0, 1.25)[i % 2],
            sample_format="float32",  # compared sample by sample, not by hash
        )
        for i in range(JOBS)
    ]
    worker = cluster.start(
        "run", "--burst", log_name=f"b{batch_size}.log", COSYQ_BATCH_SIZE=str(batch_size)
    )
    assert worker.wait(timeout=600) == 0
    assert statuses(connection, jobs) == ["finished"] * JOBS
    return jobs


def test_24_seeded_jobs_batched_match_the_same_jobs_alone(
    cluster: Cluster, connection: redis.Redis, tiny_model_dir: Path, tmp_path: Path
) -> None:
    cluster.overrides.update(
        COSYQ_ENGINE="tests.doubles.engines:tiny_as_configured",  # 2 flow steps
        COSYQ_MODEL_DIR=str(tiny_model_dir),
        COSYQ_DEVICE="cpu",
        COSYQ_DTYPE="fp32",
        COSYQ_THREADS="1",
        COSYQ_HASH_CACHE_DIR=str(tmp_path / "hashes"),
    )
    batched = run_jobs(cluster, connection, 8)
    alone = run_jobs(cluster, connection, 1)
    sizes = [result(job)["batch_size"] for job in batched]
    assert sum(size >= 4 for size in sizes) > JOBS // 2, sizes
    for together, single in zip(batched, alone, strict=True):
        assert result(single)["batch_size"] == 1
        assert result(together)["speech_tokens"] == result(single)["speech_tokens"]
        a, b = samples(result(together)["uri"]), samples(result(single)["uri"])
        assert a.shape == b.shape
        assert float(np.max(np.abs(a - b))) <= MAX_ABS  # issue 10's bound for the batched path


def samples(uri: str) -> np.ndarray:
    data, _ = sf.read(urlsplit(uri).path, dtype="float32")
    return np.asarray(data)
