"""COSYQ_LOG_LEVEL=DEBUG on a worker (real Redis, RQ's own SimpleWorker as ours runs it): RQ's
DEBUG lines, which print each job's return value (an add-voice job's transcript, a result's
metadata), stay out of the log, while its INFO lines and our own DEBUG lines are kept."""

from __future__ import annotations

import io
import json

import redis
from rq import Queue, SimpleWorker
from rq.serializers import JSONSerializer

from shared.logs import configure_logging, get_logger
from shared.settings import load_settings


def test_rq_prints_no_job_result_at_debug_and_our_debug_lines_stay(redis_url: str) -> None:
    stream = io.StringIO()
    settings = load_settings(env_file=None, log_level="debug", log_format="json")
    configure_logging(settings, stream=stream)
    connection = redis.Redis.from_url(redis_url)
    queue = Queue("debug-logs", connection=connection, serializer=JSONSerializer)
    job = queue.enqueue("json.loads", '{"transcript": "secret words of a voice"}')
    worker = SimpleWorker(
        [queue], connection=connection, serializer=JSONSerializer, log_job_description=False
    )
    worker.work(burst=True, logging_level=settings.log_level)  # what `cosyq-worker run` passes
    get_logger("workers.test").debug("our_debug_line", job_id=job.id)
    connection.close()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert job.get_status(refresh=False) is not None
    assert "secret words" not in stream.getvalue(), stream.getvalue()
    rq_lines = [line for line in lines if line.get("logger", "").startswith("rq")]
    assert any(job.id in line["event"] and "Job OK" in line["event"] for line in rq_lines)
    assert all(line["level"] != "debug" for line in rq_lines)
    assert any(line["event"] == "our_debug_line" for line in lines)
