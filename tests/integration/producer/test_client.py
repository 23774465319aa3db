"""CosyqClient against a real Redis: round trips, batching, idempotency, backpressure."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import tomllib
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from producer import CosyqClient
from shared import keys
from shared.audio import decode_audio
from shared.errors import (
    InvalidRequestError,
    JobFailedError,
    JobNotFoundError,
    QueueFullError,
    ResultTimeoutError,
)
from shared.settings import Settings, load_settings
from shared.storage import open_storage
from tests.doubles.engines import per_char_seconds
from tests.doubles.harness import write_model_dir
from tests.doubles.rq_workers import (
    run_burst,
    run_cosyq_burst,
    start_worker_process,
    stop_worker_process,
)


@pytest.fixture
def settings(redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Settings in the environment too, so worker processes see them: the real task and worker
    with a test engine whose audio length follows the text."""
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_ENGINE", "tests.doubles.engines:per_char")
    monkeypatch.setenv("COSYQ_MODEL_DIR", str(write_model_dir(tmp_path / "model")))
    monkeypatch.setenv("COSYQ_STORAGE_URL", (tmp_path / "audio").as_uri())
    monkeypatch.setenv("COSYQ_MAX_RETRIES", "0")
    return load_settings(env_file=None)


@pytest.fixture
def client(settings: Settings) -> Iterator[CosyqClient]:
    with CosyqClient(settings) as made:
        yield made


class CountingConnection(redis.Connection):
    """Counts writes to the socket: one per command, one per pipeline (= one round trip)."""

    sends = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        CountingConnection.sends += 1
        super().send_packed_command(command, check_health)


def counting_client(settings: Settings) -> CosyqClient:
    pool = redis.ConnectionPool.from_url(settings.redis_url, connection_class=CountingConnection)
    return CosyqClient(settings, connection=redis.Redis(connection_pool=pool))


def texts(n: int, **fields: Any) -> list[dict[str, Any]]:
    return [{"text": f"Sentence number {i}.", **fields} for i in range(n)]


# ---- round trip


def test_submit_result_round_trip(client: CosyqClient, settings: Settings) -> None:
    job_id = client.submit(
        {
            "text": "Hello from the producer.",
            "format": "flac",
            "sample_rate": 16000,
            "metadata": {"order": 7},
        }
    )
    assert client.status(job_id).state == "queued"
    run_cosyq_burst(client.settings)
    result = client.result(job_id, timeout=5)
    assert result.job_id == job_id and result.format == "flac" and result.sample_rate == 16000
    assert result.metadata == {"order": 7}
    expected_s = per_char_seconds("Hello from the producer.")
    assert result.duration_s == pytest.approx(expected_s, abs=1e-3)
    samples, rate = decode_audio(open_storage(settings).get(result.uri))
    assert rate == 16000 and samples.size == round(expected_s * 16000)
    status = client.status(job_id)
    assert status.state == "finished" and status.result == result
    assert status.queue == keys.QUEUE_DEFAULT and status.submitted["text_chars"] == 24


def test_result_waits_for_a_worker_process(client: CosyqClient) -> None:
    job_id = client.submit({"text": "Waited for.", "priority": "low"})
    worker = start_worker_process(client.settings.redis_url, burst=True)
    try:
        result = client.result(job_id, timeout=60)
    finally:
        stop_worker_process(worker)
    assert result.worker_pid == worker.pid


def test_result_times_out_and_unknown_jobs_are_named(client: CosyqClient) -> None:
    job_id = client.submit({"text": "Nobody runs me."})
    started = time.monotonic()
    with pytest.raises(ResultTimeoutError, match=f"job {job_id} is queued after 0.3 s"):
        client.result(job_id, timeout=0.3)
    assert 0.25 < time.monotonic() - started < 2
    with pytest.raises(JobNotFoundError, match="no job nope"):
        client.status("nope")
    with pytest.raises(JobNotFoundError):
        client.result("nope", timeout=1)


def test_worker_side_validation_failure_is_reported(client: CosyqClient) -> None:
    """A payload pushed straight into Redis (bypassing the producer) fails with the rule."""
    queue = Queue(keys.QUEUE_DEFAULT, connection=client.connection, serializer=JSONSerializer)
    bad = queue.enqueue(keys.SYNTHESIZE_FUNCTION, kwargs={"request": {"text": "x" * 2001}})
    run_cosyq_burst(client.settings)
    with pytest.raises(JobFailedError) as caught:
        client.result(bad.id, timeout=5)
    assert caught.value.kind == "invalid_request"
    assert caught.value.reason == "text: 2,001 characters, limit 2,000"
    failure = client.status(bad.id).failure
    assert failure is not None and failure.kind == "invalid_request"


def test_failure_without_a_reason_falls_back_to_the_exception(client: CosyqClient) -> None:
    """A stock `rq worker` (not CosyqWorker) on cosyq's queues: the task fails with no reason
    in the job's meta, and the client reports RQ's exception instead."""
    job_id = client.submit({"text": "Crash."})
    run_burst(client.connection)
    with pytest.raises(
        JobFailedError, match=r"\(internal\): RuntimeError: no synthesis engine is loaded"
    ):
        client.result(job_id, timeout=5)
    job = Job.fetch(job_id, connection=client.connection, serializer=JSONSerializer)
    assert keys.ERROR_META_KEY not in job.meta  # nothing wrote cosyq's reason


def test_job_is_stored_as_json_by_dotted_path_without_text(settings: Settings) -> None:
    with CosyqClient(settings) as client:  # the product's default function path
        # a registered voice, as far as the producer looks (it only asks that its key exists)
        client.connection.hset(keys.voice_key("alice", keys.DEFAULT_TENANT), "meta", "{}")
        job_id = client.submit({"text": "Secret words.", "voice": "alice", "seed": 3})
    raw = redis.Redis.from_url(settings.redis_url).hgetall(f"rq:job:{job_id}")
    func, _, args, kwargs = json.loads(zlib.decompress(raw[b"data"]))
    assert func == "workers.tasks.synthesize" and args == []
    assert kwargs["request"]["text"] == "Secret words." and kwargs["request"]["seed"] == 3
    assert b"Secret" not in raw[b"description"] and b"Secret" not in raw[b"meta"]
    assert json.loads(raw[b"meta"])["cosyq_submit"]["voice"] == "alice"
    assert int(raw[b"timeout"]) == settings.job_timeout_s


# ---- submit_many


def test_submit_many_is_three_round_trips_per_chunk(settings: Settings) -> None:
    chunked = settings.model_copy(update={"submit_chunk_size": 100})
    with counting_client(chunked) as client:
        client.submit({"text": "warm-up: connects and caches the server version"})
        CountingConnection.sends = 0
        ids = client.submit_many(texts(250))
        # per chunk of 100 + 100 + 50: WATCH the queues, their depths, the MULTI/EXEC
        assert CountingConnection.sends == 3 * 3
        CountingConnection.sends = 0
        keyed = [{**r, "idempotency_key": f"k{i}"} for i, r in enumerate(texts(250))]
        client.submit_many(keyed)
        assert CountingConnection.sends == 3 * 4  # each chunk also reads who holds its keys
    assert len(set(ids)) == 250
    assert client.queue_depths()[keys.QUEUE_DEFAULT] == 1 + 250 + 250
    queued = Queue(keys.QUEUE_DEFAULT, connection=client.connection).get_job_ids()
    assert queued[1:251] == ids  # request order kept


def test_submit_many_routes_priorities(client: CosyqClient) -> None:
    ids = client.submit_many(
        [{"text": "a", "priority": "low"}, {"text": "b", "priority": "high"}, {"text": "c"}]
    )
    assert client.queue_depths() == {"cosyq-high": 1, "cosyq-default": 1, "cosyq-low": 1}
    assert [client.status(i).queue for i in ids] == ["cosyq-low", "cosyq-high", "cosyq-default"]
    run_cosyq_burst(client.settings)
    outcomes = client.wait_many(ids, timeout=5)
    assert [outcomes[i].job_id for i in ids] == ids  # type: ignore[union-attr]


def test_submit_many_enqueues_nothing_when_one_request_is_invalid(client: CosyqClient) -> None:
    requests = [*texts(3), {"text": "ok", "speed": 5}]
    with pytest.raises(InvalidRequestError, match=r"requests\[3\]: speed: 5.0 is outside"):
        client.submit_many(requests)
    assert sum(client.queue_depths().values()) == 0


def test_submit_and_submit_many_take_markup_plain_and_the_engine_gets_it_as_words(
    client: CosyqClient,
) -> None:
    """markup "plain": angle brackets are words (the engine is given each "<" that could open
    markup as a character, "List< String>"); unmarked, the same text is refused naming plain."""
    text = "A List<String> and <b>bold</b>, then <|user|> here."
    spoken = "A List< String> and < b>bold< /b>, then < |user|> here."
    with pytest.raises(InvalidRequestError, match=r'requests\[1\]: text: .*send markup "plain"'):
        client.submit_many([{"text": "Fine."}, {"text": text}])
    assert sum(client.queue_depths().values()) == 0
    ids = [
        client.submit({"text": text, "markup": "plain"}),
        *client.submit_many([{"text": text, "markup": "plain"}] * 2),
    ]
    run_cosyq_burst(client.settings)
    for job_id in ids:
        result = client.result(job_id, timeout=5)
        assert [piece.text for piece in result.pieces] == [spoken]  # what the engine read
        assert result.duration_s == pytest.approx(per_char_seconds(spoken), abs=1e-3)


# ---- idempotency


def test_same_idempotency_key_same_job(client: CosyqClient) -> None:
    first = client.submit({"text": "Once only.", "idempotency_key": "order-1"})
    again = client.submit({"text": "Once only.", "idempotency_key": "order-1"})
    other = client.submit({"text": "Once only.", "idempotency_key": "order-2"})
    assert first == again != other
    assert client.queue_depths()[keys.QUEUE_DEFAULT] == 2
    run_cosyq_burst(client.settings)
    assert client.submit({"text": "Once only.", "idempotency_key": "order-1"}) == first
    assert client.queue_depths()[keys.QUEUE_DEFAULT] == 0  # no second synthesis after it ran
    assert client.result(first, timeout=1).idempotency_key == "order-1"


def test_a_key_whose_job_was_deleted_or_expired_is_free_again(settings: Settings) -> None:
    request = {"text": "Once only.", "idempotency_key": "order-9"}
    quick = settings.model_copy(update={"idempotency_claim_grace_s": 0})
    with CosyqClient(quick) as client:
        queue = Queue(keys.QUEUE_DEFAULT, connection=client.connection, serializer=JSONSerializer)
        first = client.submit(request)
        assert client.submit(request) == first  # its job exists: the same job
        queue.empty()  # what `rq empty` does: the job hashes go too
        second = client.submit(request)
        assert second != first and queue.get_job_ids() == [second]
        queue.fetch_job(second).delete()  # rq-dashboard's delete
        third = client.submit(request)
        assert third not in (first, second) and queue.get_job_ids() == [third]
        client.connection.pexpire(f"rq:job:{third}", 1)  # an expired job
        time.sleep(0.05)
        assert client.submit(request) not in (first, second, third)
    with CosyqClient(settings) as client:
        # A front of an earlier release has claimed the key and not enqueued yet: younger
        # than COSYQ_IDEMPOTENCY_CLAIM_GRACE_S, its job may still be on its way in.
        claim = (keys.idempotency_key("order-10", keys.DEFAULT_TENANT), "in-flight-job")
        now = client.connection.time()[0]
        client.connection.set(claim[0], f"{claim[1]} {now}", ex=60)
        depth = client.queue_depths()[keys.QUEUE_DEFAULT]
        assert client.submit({"text": "In flight.", "idempotency_key": "order-10"}) == claim[1]
        assert client.queue_depths()[keys.QUEUE_DEFAULT] == depth  # no second job made


def test_rq_empty_frees_the_key_within_the_claim_grace(
    settings: Settings, client: CosyqClient
) -> None:
    """`rq empty` deletes the job hashes; the key said its job was enqueued, so a resubmit a
    moment later (well inside the 60 s grace) makes a new job instead of naming the dead one."""
    assert settings.idempotency_claim_grace_s >= 60
    request = {"text": "Once only.", "idempotency_key": "order-11"}
    batch = [request, {"text": "Twice.", "idempotency_key": "order-12"}]
    first, other = client.submit_many(batch)
    assert client.submit(request) == first  # its job exists: the same job
    rq = Path(sys.executable).parent / "rq"
    emptied = subprocess.run(
        [
            str(rq),
            "empty",
            keys.QUEUE_DEFAULT,
            "--url",
            settings.redis_url,
            "-S",
            "rq.serializers.JSONSerializer",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert emptied.returncode == 0, emptied.stderr
    assert not client.connection.exists(f"rq:job:{first}")
    again, other_again = client.submit_many(batch)
    assert first != again and other != other_again
    assert sorted(client._queues[keys.QUEUE_DEFAULT].get_job_ids()) == sorted([again, other_again])
    with pytest.raises(JobNotFoundError):
        client.status(first)
    run_cosyq_burst(client.settings)
    assert client.result(again, timeout=1).idempotency_key == "order-11"


def test_duplicate_keys_within_one_batch(client: CosyqClient) -> None:
    ids = client.submit_many(
        [
            {"text": "a", "idempotency_key": "k"},
            {"text": "b"},
            {"text": "a", "idempotency_key": "k"},
        ]
    )
    assert ids[0] == ids[2] != ids[1]
    assert client.queue_depths()[keys.QUEUE_DEFAULT] == 2


def test_concurrent_submitters_race_for_one_key(settings: Settings) -> None:
    barrier = threading.Barrier(8)
    ids: list[str] = []

    def submit() -> None:
        with CosyqClient(settings) as own:
            barrier.wait()
            ids.append(own.submit({"text": "Race.", "idempotency_key": "race-1"}))

    threads = [threading.Thread(target=submit) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(ids) == 8 and len(set(ids)) == 1
    with CosyqClient(settings) as client:
        assert client.queue_depths()[keys.QUEUE_DEFAULT] == 1


# ---- backpressure


def test_backpressure_raises_with_what_was_submitted(settings: Settings) -> None:
    small = settings.model_copy(update={"max_queue_depth": 5})
    with CosyqClient(small) as client:
        ids = client.submit_many(texts(3))
        with pytest.raises(QueueFullError) as caught:
            client.submit_many(texts(4))
        error = caught.value
        assert (error.queue, error.depth, len(error.submitted)) == ("cosyq-default", 5, 2)
        assert "cosyq-default holds 5 jobs (COSYQ_MAX_QUEUE_DEPTH 5); 2 submitted" in str(error)
        with pytest.raises(QueueFullError):
            client.submit({"text": "one more"})
        assert client.submit({"text": "other queue", "priority": "high"})  # its own limit
        assert client.queue_depths()["cosyq-default"] == 5
        run_cosyq_burst(client.settings)
        assert client.submit({"text": "room again"}) not in ids


def test_backpressure_blocks_until_room(settings: Settings) -> None:
    blocking = settings.model_copy(
        update={"max_queue_depth": 2, "backpressure": "block", "backpressure_timeout_s": 30}
    )
    with CosyqClient(blocking) as client:
        client.submit_many(texts(2))
        worker: subprocess.Popen[bytes] | None = None

        def start_worker_later() -> None:
            nonlocal worker
            time.sleep(0.5)
            worker = start_worker_process(settings.redis_url, burst=False)

        starter = threading.Thread(target=start_worker_later)
        started = time.monotonic()
        starter.start()
        try:
            ids = client.submit_many(texts(3))  # 3 > room for 2: waits for the worker
        finally:
            starter.join()
            if worker is not None:
                stop_worker_process(worker)
        assert time.monotonic() - started >= 0.5 and len(ids) == 3


def test_backpressure_block_gives_up_after_the_timeout(settings: Settings) -> None:
    blocking = settings.model_copy(
        update={"max_queue_depth": 1, "backpressure": "block", "backpressure_timeout_s": 0.4}
    )
    with CosyqClient(blocking) as client:
        client.submit({"text": "fills it"})
        started = time.monotonic()
        with pytest.raises(QueueFullError):
            client.submit({"text": "waits, then gives up"})
        assert 0.35 < time.monotonic() - started < 3


# ---- packaging


def test_import_producer_leaves_model_and_http_libraries_out() -> None:
    code = (
        "import sys, producer, producer.client, producer.tracking, shared.storage, shared.audio,"
        " shared.logs, shared.connection, producer.cli, producer.http_bind\n"
        "producer.cli.build_parser()\n"  # every command registered, `serve` included
        "heavy = [m for m in ('torch', 'onnxruntime', 'coremltools', 'onnx', 'boto3', 'workers',"
        " 'fastapi', 'uvicorn', 'starlette', 'multipart') if m in sys.modules]\n"
        "print(heavy)\n"
    )
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


def test_the_base_install_requires_no_model_or_http_server_package() -> None:
    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text())["project"]
    base = {re.split(r"[<>=!~; \[]", dep, maxsplit=1)[0].lower() for dep in project["dependencies"]}
    assert base.isdisjoint({"torch", "onnxruntime", "coremltools", "fastapi", "uvicorn"})
    http = {
        re.split(r"[<>=!~; \[]", dep, maxsplit=1)[0].lower()
        for dep in project["optional-dependencies"]["http"]
    }
    assert http >= {"fastapi", "uvicorn", "python-multipart"}
    assert http.isdisjoint({"torch", "onnxruntime", "coremltools"})
