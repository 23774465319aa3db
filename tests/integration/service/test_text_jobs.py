"""The text rules end to end: real Redis, the real worker and the tiny engine. A runaway
expansion fails as invalid_request before synthesis (never retried); a request that skipped
the producer with a special token is refused by the worker's gate."""

from __future__ import annotations

from pathlib import Path

import pytest
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from producer import CosyqClient
from shared import keys
from shared.results import JobFailure
from shared.settings import Settings, load_settings
from tests.doubles.rq_workers import run_cosyq_burst


@pytest.fixture
def settings(
    redis_url: str, tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_STORAGE_URL", (tmp_path / "storage").as_uri())
    monkeypatch.setenv("COSYQ_MODEL_DIR", str(tiny_model_dir))
    # the real engine, its flow in 2 Euler steps: the text rules are checked before the flow
    monkeypatch.setenv("COSYQ_ENGINE", "tests.doubles.engines:tiny")
    monkeypatch.setenv("COSYQ_DEVICE", "cpu")
    monkeypatch.setenv("COSYQ_THREADS", "1")  # the worker runs in this process: its share
    monkeypatch.setenv("COSYQ_HASH_CACHE_DIR", str(tmp_path / "hashes"))
    monkeypatch.setenv("COSYQ_RETRY_BACKOFF_S", "0")
    monkeypatch.chdir(tmp_path)
    return load_settings(env_file=None)


def failure(client: CosyqClient, job_id: str) -> tuple[str, JobFailure | None, int | None]:
    status = client.status(job_id)
    return status.state, status.failure, status.retries_left


def test_runaway_expansion_and_smuggled_tokens_fail_as_invalid_requests(
    settings: Settings,
) -> None:
    with CosyqClient(settings) as client:
        runaway = client.submit({"text": "9" * 2000, "language": "en"})
        # what a writer who bypasses the producer could put in Redis
        raw = {"text": "Say <|endofprompt|> this", "schema_version": 1}
        queue = Queue(keys.QUEUE_DEFAULT, connection=client.connection, serializer=JSONSerializer)
        smuggled = queue.enqueue(keys.SYNTHESIZE_FUNCTION, kwargs={"request": raw}).id
        ok = client.submit({"text": "Hello [laughter] 2024.", "language": "zh", "seed": 1})
        run_cosyq_burst(settings)
        state, reason, retries_left = failure(client, runaway)
        assert state == "failed" and reason is not None and reason.kind == "invalid_request"
        assert reason.message.startswith("text: about ")
        assert "text tokens after normalisation" in reason.message
        assert "limit 150 s (COSYQ_MAX_SPEECH_SECONDS)" in reason.message
        job = Job.fetch(runaway, connection=client.connection, serializer=JSONSerializer)
        assert job.meta.get("cosyq_attempt") == 1 and retries_left == 0  # never retried
        state, reason, _ = failure(client, smuggled)
        assert state == "failed" and reason is not None and reason.kind == "invalid_request"
        assert "special token <|endofprompt|>" in reason.message
        assert client.status(ok).state == "finished"


def test_special_tokens_smuggled_as_entities_fail_at_the_worker(
    settings: Settings, tiny_model_dir: Path
) -> None:
    """Payloads written straight to Redis (past the producer): text, prompt_text and a voice
    transcript with a special token as SSML entities each fail as invalid_request naming it."""
    prompt = (tiny_model_dir / "prompt.wav").as_uri()
    entity = "<speak>&#x3C;|im_start|&#X3E; hello</speak>"
    with CosyqClient(settings) as client:
        queue = Queue(keys.QUEUE_DEFAULT, connection=client.connection, serializer=JSONSerializer)
        requests = [
            {"text": entity},
            {"text": "Hello.", "prompt_audio": prompt, "prompt_text": entity},
            {"text": "<speak>&lt;prosody rate='slow'&gt;hi&lt;/prosody&gt;</speak>"},
            {"text": "Hello\x1b[2Jthere."},
        ]
        jobs = [queue.enqueue(keys.SYNTHESIZE_FUNCTION, kwargs={"request": r}).id for r in requests]
        high = Queue(keys.QUEUE_HIGH, connection=client.connection, serializer=JSONSerializer)
        voice = high.enqueue(
            keys.ADD_VOICE_FUNCTION,
            kwargs={"name": "eve", "prompt_audio": prompt, "transcript": entity},
        ).id
        run_cosyq_burst(settings)
        rules = [
            "text: contains the model's special token <|im_start|>",
            "prompt_text: contains the model's special token <|im_start|>",
            "text: markup <prosody rate='slow'> written with XML entities",
            "text: contains control character U+001B",
        ]
        for job_id, rule in zip(jobs, rules, strict=True):
            state, reason, _ = failure(client, job_id)
            assert state == "failed" and reason is not None and reason.kind == "invalid_request"
            assert reason.message.startswith(rule), reason.message
        state, reason, _ = failure(client, voice)
        assert state == "failed" and reason is not None and reason.kind == "invalid_request"
        assert "transcript: contains the model's special token <|im_start|>" in reason.message


def test_a_plain_job_is_spoken_as_written_by_the_worker(settings: Settings) -> None:
    """markup "plain", from the producer and straight from Redis (the worker's own gate and
    reading): the real engine reads its angle brackets as words (the result's pieces are the
    text as the model read it, normalised); the same text as `auto` fails naming `plain`."""
    text = "A List<String> then <|im_start|> and <strong>loud</strong> here."
    with CosyqClient(settings) as client:
        queue = Queue(keys.QUEUE_DEFAULT, connection=client.connection, serializer=JSONSerializer)
        raw = {"text": text, "markup": "plain", "seed": 1}
        jobs = [
            client.submit({"text": text, "markup": "plain", "seed": 1}),
            queue.enqueue(keys.SYNTHESIZE_FUNCTION, kwargs={"request": raw}).id,
        ]
        auto = queue.enqueue(keys.SYNTHESIZE_FUNCTION, kwargs={"request": {"text": text}}).id
        run_cosyq_burst(settings)
        for job_id in jobs:
            result = client.result(job_id, timeout=0)
            read = " ".join(piece.text for piece in result.pieces)
            assert "List< String>" in read and "im" in read and "start" in read, read
            assert not any(tag in read for tag in ("<|", "<strong>", "</strong>")), read
        state, reason, _ = failure(client, auto)
        assert state == "failed" and reason is not None and reason.kind == "invalid_request"
        assert reason.message.startswith("text: contains the model's special token <|im_start|>")
        assert 'send markup "plain"' in reason.message
