"""The synthesize job function without a queue: validate, voice, synthesize, encode, store."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import redis
import soundfile as sf
import structlog
from rq.job import Job

from shared.errors import InvalidRequestError
from shared.jobs import RequestLimits
from shared.logs import configure_logging
from shared.settings import load_settings
from shared.storage import open_storage
from shared.tenants import TENANT_META_KEY
from shared.voices import VoiceRegistry
from tests.doubles.engines import ScriptedEngine
from tests.doubles.harness import write_model_dir
from workers.service.job_runtime import WorkerRuntime, prompt_roots
from workers.tasks import JobContext, check_readable_prompt, run_synthesis
from workers.voices.book import VoiceBook

SECRET_TEXT = "the launch code is swordfish"


@pytest.fixture
def runtime(tmp_path: Path, redis_url: str) -> Iterator[WorkerRuntime]:
    settings = load_settings(
        env_file=None, storage_url=(tmp_path / "out").as_uri(), model_dir=tmp_path / "model"
    )
    write_model_dir(tmp_path / "model")
    engine = ScriptedEngine()
    storage = open_storage(settings)
    connection = redis.Redis.from_url(redis_url)
    registry = VoiceRegistry(connection)
    voices = VoiceBook(
        engine, storage, model_dir=settings.model_dir, registry=registry, max_prompt_seconds=30
    )
    roots = prompt_roots(settings)
    yield WorkerRuntime(settings, engine, storage, voices, RequestLimits(), "w1", 4242, roots)
    connection.close()


def context(attempt: int = 1) -> JobContext:
    started = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    return JobContext("job123", "cosyq-default", attempt, started - timedelta(seconds=2), started)


def test_a_job_whose_meta_lost_its_tenant_tag_is_nobodys(redis_url: str) -> None:
    """The hash re-created without meta (deleted while it ran): no tenant, never "default";
    its voices are looked up as its queue's tenant's, which admission checked."""
    connection = redis.Redis.from_url(redis_url)
    job = Job.create("workers.tasks.synthesize", connection=connection, origin="cosyq-low.beta")
    untagged = JobContext.from_job(job)
    assert untagged.tenant is None and untagged.scope_tenant == "beta"
    job.meta[TENANT_META_KEY] = "beta"
    assert JobContext.from_job(job).tenant == "beta"
    connection.close()


def test_result_points_at_stored_audio_with_identity_and_timings(runtime: WorkerRuntime) -> None:
    request = {"text": "hello", "format": "flac", "sample_rate": 16000, "metadata": {"k": 1}}
    result = run_synthesis(runtime, request, context(attempt=2))
    path = Path(result.uri.removeprefix("file://"))
    assert path.name == "job123.flac" and "2026/01/02" in result.uri
    samples, rate = sf.read(io.BytesIO(path.read_bytes()))
    assert rate == 16000 and abs(len(samples) / rate - result.duration_s) < 1e-3
    assert (result.worker_name, result.worker_pid, result.attempt) == ("w1", 4242, 2)
    assert result.model.name == "test-scripted" and result.backend == "test"
    assert result.timings.queue_wait_s == 2.0 and result.timings.total_s > 0
    assert result.metadata == {"k": 1}
    t = result.timings
    stages_s = t.frontend_s + t.llm_s + t.flow_s + t.hift_s + t.join_s
    wall_s = result.rtf * result.duration_s  # start -> samples ready: the stages and no more
    assert stages_s <= wall_s * (1 + 1e-9) and wall_s <= t.total_s - t.encode_s - t.store_s
    assert result.rtf > 0


def test_validation_runs_again_in_the_worker(runtime: WorkerRuntime) -> None:
    with pytest.raises(InvalidRequestError, match="text: 2,001 characters, limit 2,000"):
        run_synthesis(runtime, {"text": "x" * 2001}, context())
    with pytest.raises(InvalidRequestError, match=r"speed: 9\.0 is outside"):
        run_synthesis(runtime, {"text": "hi", "speed": 9.0}, context())


def test_inline_prompt_is_read_through_storage(runtime: WorkerRuntime, tmp_path: Path) -> None:
    prompt = tmp_path / "model" / "prompt.wav"
    request = {"text": "hi", "prompt_audio": prompt.as_uri(), "prompt_text": "a test prompt"}
    assert run_synthesis(runtime, request, context()).uri.endswith(".wav")
    short = tmp_path / "model" / "8k.wav"
    sf.write(short, [0.0] * 8000, 8000)
    bad = {"text": "hi", "prompt_audio": short.as_uri(), "prompt_text": "x"}
    with pytest.raises(InvalidRequestError, match="8000 Hz, need at least 16000 Hz"):
        run_synthesis(runtime, bad, context())


def test_a_prompt_outside_the_prompt_roots_is_refused(
    runtime: WorkerRuntime, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere.wav"
    outside.write_bytes((tmp_path / "model" / "prompt.wav").read_bytes())
    for uri in (outside.as_uri(), "file:///etc/hostname", (tmp_path / "modelx.wav").as_uri()):
        request = {"text": "hi", "prompt_audio": uri, "prompt_text": "a test prompt"}
        with pytest.raises(InvalidRequestError) as caught:
            run_synthesis(runtime, request, context())
        assert str(caught.value) == (
            f"prompt_audio: {uri} is outside the folders this worker reads prompts from "
            "(COSYQ_PROMPT_ROOTS)"
        )
    request = {"text": "hi", "prompt_audio": outside.as_uri(), "prompt_text": "a test prompt"}
    settings = runtime.settings.model_copy(update={"prompt_roots": tmp_path.as_uri()})
    widened = replace(runtime, settings=settings, prompt_roots=prompt_roots(settings))
    assert run_synthesis(widened, request, context()).uri.endswith(".wav")


def test_symlinks_under_the_storage_prefix_that_lead_outside_are_refused(
    runtime: WorkerRuntime, tmp_path: Path
) -> None:
    """A file link and a folder link under the storage prefix, pointing outside every root, are
    refused by the synthesis and the add-voice gate; a link that stays inside is followed."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "p.wav").write_bytes((tmp_path / "model" / "prompt.wav").read_bytes())
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / "file-link.wav").symlink_to(secret / "p.wav")
    (out / "folder-link").symlink_to(secret, target_is_directory=True)
    for uri in ((out / "file-link.wav").as_uri(), (out / "folder-link" / "p.wav").as_uri()):
        request = {"text": "hi", "prompt_audio": uri, "prompt_text": "a test prompt"}
        with pytest.raises(InvalidRequestError) as caught:
            run_synthesis(runtime, request, context())
        assert str(caught.value) == (
            f"prompt_audio: {uri} is a symlink, or under one, that leads outside the folders "
            "this worker reads prompts from (COSYQ_PROMPT_ROOTS)"
        )
        with pytest.raises(InvalidRequestError, match="symlink, or under one"):
            check_readable_prompt(runtime, uri)
    (out / "inside.wav").symlink_to(tmp_path / "model" / "prompt.wav")  # model dir: a root
    request = {"text": "hi", "prompt_audio": (out / "inside.wav").as_uri(), "prompt_text": "a"}
    assert run_synthesis(runtime, request, context()).uri.endswith(".wav")


def test_an_add_voice_job_gets_the_same_prompt_gate(runtime: WorkerRuntime) -> None:
    """add_voice(name, prompt_audio, ...) is called by RQ with whatever the payload says."""
    check_readable_prompt(runtime, (runtime.settings.model_dir / "prompt.wav").as_uri())
    for uri, rule in (
        ("file:///etc/shadow", "is outside the folders this worker reads prompts from"),
        ("s3://a/b", "prompt_audio: bucket: 3-63 lowercase letters"),
        (["file:///x"], "prompt_audio: must be a file:// or s3:// URI string"),
    ):
        with pytest.raises(InvalidRequestError, match=re.escape(rule)):
            check_readable_prompt(runtime, uri)


def test_malformed_prompt_uris_are_rejections_not_storage_errors(runtime: WorkerRuntime) -> None:
    for uri, rule in (
        ("s3://Bad_Bucket/p.wav", "prompt_audio: bucket: 3-63 lowercase letters"),
        ("s3://bucket/voices/../p.wav", "prompt_audio: '..' and '.' segments are not allowed"),
        ("s3://bucket//p.wav", "prompt_audio: empty segments"),
        ("file:///srv/%2e%2e/etc/passwd", "prompt_audio: '..' and '.' segments are not allowed"),
    ):
        request = {"text": "hi", "prompt_audio": uri, "prompt_text": "x"}
        with pytest.raises(InvalidRequestError, match=re.escape(rule)):
            run_synthesis(runtime, request, context())
    with pytest.raises(InvalidRequestError, match=r"text: not valid UTF-8 \(unpaired surrogate"):
        run_synthesis(runtime, {"text": "hi \ud800"}, context())


@pytest.fixture
def json_logs(runtime: WorkerRuntime) -> Iterator[io.StringIO]:
    stream = io.StringIO()
    configure_logging(runtime.settings.model_copy(update={"log_format": "json"}), stream=stream)
    yield stream
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == "cosyq"]:
        root.removeHandler(handler)
    structlog.reset_defaults()


def test_one_synthesis_finished_line_and_never_the_text(
    runtime: WorkerRuntime, json_logs: io.StringIO
) -> None:
    run_synthesis(runtime, {"text": SECRET_TEXT}, context())
    out = json_logs.getvalue()
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    finished = [e for e in events if e["event"] == "synthesis_finished"]
    assert len(finished) == 1
    assert finished[0]["text_chars"] == len(SECRET_TEXT) and finished[0]["job_id"] == "job123"
    assert {"llm_s", "encode_s", "store_s", "total_s", "rtf", "audio_s"} <= finished[0].keys()
    assert "swordfish" not in out
