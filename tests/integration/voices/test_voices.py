"""Voices end to end with real Redis and the real worker: add (upload + job + tiny engine),
list, use in synthesis jobs, remove."""

from __future__ import annotations

import dataclasses
import io
import re
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import redis
import soundfile
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from producer import CosyqClient
from producer.cli import main
from shared import keys, tenants
from shared.errors import (
    InvalidRequestError,
    JobFailedError,
    PromptSampleRateError,
    PromptSilentError,
    PromptUnreadableError,
    UnknownVoiceError,
    VoiceMismatchError,
)
from shared.settings import Settings, load_settings
from shared.storage import open_storage
from shared.voice_uploads import VoiceUpload
from shared.voices import VoiceRegistry
from tests.doubles.rq_workers import engines_reused, run_cosyq_burst
from workers.engine.api import ModelIdentity
from workers.voices.profiles import RegisteredVoices
from workers.voices.uploads import VoiceUploadSweep


@pytest.fixture(scope="module", autouse=True)
def one_engine() -> Iterator[None]:
    """The module's in-process workers share one loaded tiny engine (each burst loaded and
    warmed its own: ~20 loads)."""
    with engines_reused():
        yield


@pytest.fixture
def settings(
    redis_url: str, tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Settings:
    monkeypatch.setenv("COSYQ_REDIS_URL", redis_url)
    monkeypatch.setenv("COSYQ_STORAGE_URL", (tmp_path / "storage").as_uri())
    monkeypatch.setenv("COSYQ_MODEL_DIR", str(tiny_model_dir))
    monkeypatch.setenv("COSYQ_DEVICE", "cpu")
    # the worker runs in this process (run_cosyq_burst): one thread, its share. Two OpenMP
    # threads spinning beside the suite's other processes cost each engine warm-up 4-6 CPU s
    # on a busy 2-core host, one thread 0.3-0.6 s
    monkeypatch.setenv("COSYQ_THREADS", "1")
    monkeypatch.setenv("COSYQ_HASH_CACHE_DIR", str(tmp_path / "hashes"))
    monkeypatch.setenv("COSYQ_MAX_RETRIES", "0")
    monkeypatch.chdir(tmp_path)  # no stray .env
    return load_settings(env_file=None)


@pytest.fixture
def client(settings: Settings) -> Iterator[CosyqClient]:
    with CosyqClient(settings) as client:
        yield client


@pytest.fixture
def prompt_bytes(tiny_model_dir: Path) -> bytes:
    return (tiny_model_dir / "prompt.wav").read_bytes()


def wav_bytes(samples: np.ndarray, rate: int, fmt: str = "WAV") -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=fmt)
    return buffer.getvalue()


def speak(client: CosyqClient, settings: Settings, voice: str, seed: int = 3) -> Job:
    """Run a real synthesize job naming `voice`; the finished (or failed) job."""
    job_id = client.submit({"text": "Hello there.", "voice": voice, "seed": seed})
    run_cosyq_burst(settings)
    return Job.fetch(job_id, connection=client.connection, serializer=JSONSerializer)


def test_add_list_use_remove(
    client: CosyqClient, settings: Settings, prompt_bytes: bytes, tiny_engine
) -> None:
    job_id = client.add_voice("alice", prompt_bytes, "This is Alice.", filename="alice.wav")
    stored = Queue(keys.QUEUE_HIGH, connection=client.connection, serializer=JSONSerializer)
    job = stored.fetch_job(job_id)
    assert job is not None and job.func_name == keys.ADD_VOICE_FUNCTION
    uri = job.kwargs["prompt_audio"]
    assert uri.startswith("file://") and "/voices/default/alice/" in uri and uri.endswith(".wav")
    run_cosyq_burst(settings)
    summary = client.wait_for_voice(job_id, timeout=5)
    assert summary.name == "alice" and summary.transcript == "This is Alice."
    assert summary.speech_tokens == 50 and summary.source_sample_rate == 24000
    assert summary.checkpoint_hash == tiny_engine.identity.checkpoint_hash
    assert summary.source_uri == uri

    assert [v.name for v in client.list_voices()] == ["alice"]
    profile = VoiceRegistry(client.connection).load("alice")
    samples, rate = soundfile.read(io.BytesIO(prompt_bytes), dtype="float32")
    direct = tiny_engine.extract_voice(samples, rate, "This is Alice.")
    assert np.array_equal(profile.speech_tokens, direct.speech_tokens)
    assert np.array_equal(profile.mel, direct.mel)
    assert np.array_equal(profile.embedding, direct.embedding)

    results = [speak(client, settings, "alice").return_value() for _ in range(2)]
    assert all(r is not None for r in results)
    assert results[0]["sha256"] == results[1]["sha256"]  # seeded: the same audio
    assert results[0]["duration_s"] > 0

    client.remove_voice("alice")
    assert client.list_voices() == []
    with pytest.raises(UnknownVoiceError, match="no voice named 'alice'"):
        client.remove_voice("alice")


def test_a_missing_voice_is_refused_at_submit_and_again_at_the_worker(
    client: CosyqClient, settings: Settings, prompt_bytes: bytes
) -> None:
    """The producer refuses a voice nobody registered, nothing queued (in a list: naming the
    request); a voice removed while its job waits fails that job clearly at the worker."""
    with pytest.raises(UnknownVoiceError, match="no voice named 'nobody' is registered"):
        client.submit({"text": "Hello there.", "voice": "nobody"})
    with pytest.raises(UnknownVoiceError, match=r"^requests\[1\]: voice: no voice named 'nobody'"):
        client.submit_many([{"text": "Hi."}, {"text": "Hi.", "voice": "nobody"}])
    assert client.queue_depths()[keys.QUEUE_DEFAULT] == 0
    run = client.add_voice("gone", prompt_bytes, "Gone soon.")
    run_cosyq_burst(settings)
    client.wait_for_voice(run, timeout=5)
    job_id = client.submit({"text": "Hello there.", "voice": "gone"})
    client.remove_voice("gone")
    run_cosyq_burst(settings)
    status = client.status(job_id)
    assert status.state == "failed" and status.failure is not None
    assert "no voice named 'gone' is registered" in status.failure.message


def test_profile_from_other_weights_is_refused(
    client: CosyqClient, settings: Settings, prompt_bytes: bytes, tiny_engine
) -> None:
    run = client.add_voice("bob", prompt_bytes, "Bob.")
    run_cosyq_burst(settings)
    client.wait_for_voice(run, timeout=5)
    other = dataclasses.replace(tiny_engine.identity, checkpoint_hash="f" * 16)
    assert isinstance(other, ModelIdentity)
    voices = RegisteredVoices(VoiceRegistry(client.connection), other)
    with pytest.raises(VoiceMismatchError, match="add it again with `cosyq voices add bob"):
        voices.resolve("default", "bob")


def test_the_producer_refuses_bad_recordings_before_uploading(
    client: CosyqClient, settings: Settings
) -> None:
    t = np.arange(16000) / 16000
    cases = [
        (b"not audio at all", PromptUnreadableError, "unreadable.wav: not a readable audio"),
        (wav_bytes(0.3 * np.sin(2 * np.pi * 200 * t), 8000), PromptSampleRateError, "8000 Hz"),
        (wav_bytes(np.zeros(24000), 24000), PromptSilentError, "silent"),
        (wav_bytes(np.full(24000, 0.5), 24000), PromptSilentError, "constant offset"),
    ]
    for data, error, message in cases:
        with pytest.raises(error, match=message):
            client.add_voice("carol", data, filename="unreadable.wav")
    with pytest.raises(InvalidRequestError, match="reserved"):
        client.add_voice("default", wav_bytes(0.3 * np.sin(2 * np.pi * 200 * t), 16000))
    assert not (Path(settings.storage_url.removeprefix("file://")) / "voices").exists()
    assert client.queue_depths()[keys.QUEUE_HIGH] == 0


def test_worker_side_failure_reaches_the_producer(client: CosyqClient, settings: Settings) -> None:
    """A recording the producer could not check (edited after upload) fails with the reason."""
    t = np.arange(24000) / 24000
    job_id = client.add_voice("dave", wav_bytes(0.3 * np.sin(2 * np.pi * 200 * t), 24000))
    job = Queue(keys.QUEUE_HIGH, connection=client.connection, serializer=JSONSerializer)
    uri = job.fetch_job(job_id).kwargs["prompt_audio"]  # type: ignore[union-attr]
    Path(uri.removeprefix("file://")).write_bytes(wav_bytes(np.zeros(24000), 24000))
    run_cosyq_burst(settings)
    with pytest.raises(JobFailedError, match="silent"):
        client.wait_for_voice(job_id, timeout=5)
    assert client.list_voices() == []


def test_a_transcript_that_is_not_utf8_is_refused_again_by_the_worker(
    client: CosyqClient, settings: Settings, prompt_bytes: bytes
) -> None:
    """A job that got past the producer (written straight into Redis: JSON carries unpaired
    surrogates) fails as invalid, its upload is deleted and the worker goes on (issue 45)."""
    job_id = client.add_voice("fay", prompt_bytes, "Fay.")
    job = Job.fetch(job_id, connection=client.connection, serializer=JSONSerializer)
    job.kwargs = {**job.kwargs, "transcript": "\udcff\udcfe"}
    job.save()
    later = client.add_voice("gus", prompt_bytes, "Gus.")
    run_cosyq_burst(settings)
    with pytest.raises(JobFailedError, match="transcript: not valid UTF-8"):
        client.wait_for_voice(job_id, timeout=5)
    assert [v.name for v in client.list_voices()] == ["gus"]
    assert client.wait_for_voice(later, timeout=5).name == "gus"
    uploads = Path(settings.storage_url.removeprefix("file://")) / "voices" / "default"
    assert not list((uploads / "fay").glob("*"))
    assert list((uploads / "gus").glob("*"))  # the folder the check above looks in


def test_cli_voices_add_list_rm(
    settings: Settings, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def cosyq(*argv: str) -> int:
        return main(list(argv))

    assert cosyq("voices", "add", "erin", str(tiny_model_dir / "prompt.wav"), "--no-wait") == 0
    job_id = capsys.readouterr().out.strip()
    assert re.fullmatch("[0-9a-f]{32}", job_id)  # the job id, nothing else
    run_cosyq_burst(settings)
    assert cosyq("voices", "list") == 0
    listed = capsys.readouterr().out
    assert "erin" in listed and "voices (1)" in listed
    assert cosyq("voices", "rm", "erin") == 0
    assert "removed voice erin" in capsys.readouterr().out
    assert cosyq("voices", "rm", "erin") == 1
    assert "no voice named 'erin'" in capsys.readouterr().err
    assert cosyq("voices", "add", "bad name", str(tiny_model_dir / "prompt.wav")) == 1
    assert "voice name 'bad name'" in capsys.readouterr().err


def test_registry_rejects_corrupt_profiles(redis_url: str) -> None:
    connection = redis.Redis.from_url(redis_url)
    registry = VoiceRegistry(connection)
    connection.hset(keys.voice_key("broken", "default"), mapping={"meta": "{}", "arrays": "[]"})
    connection.sadd(keys.VOICES_SET, "broken", "gone")
    with pytest.raises(InvalidRequestError, match="stored profile is unusable"):
        registry.load("broken")
    listed = {v.name: v.model_name for v in registry.summaries()}
    assert listed == {"broken": "(unreadable)", "gone": "(unreadable)"}  # shown, so removable
    registry.remove("broken")
    registry.remove("gone")  # listed without a profile: removing it cleans the list
    assert registry.names() == []
    connection.close()


def uploads(settings: Settings, name: str, owner: str = "default") -> list[str]:
    folder = Path(settings.storage_url.removeprefix("file://")) / "voices" / owner / name
    return sorted(p.as_uri() for p in folder.iterdir()) if folder.exists() else []


def test_a_second_add_says_replaced_and_only_the_current_recording_is_kept(
    client: CosyqClient,
    settings: Settings,
    prompt_bytes: bytes,
    tiny_model_dir: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    first = client.add_voice("alice", prompt_bytes, "One.", filename="a.wav")
    second = client.add_voice("alice", prompt_bytes, "Two.", filename="b.wav")  # both queued
    assert len(uploads(settings, "alice")) == 2
    run_cosyq_burst(settings)
    one, two = client.wait_for_voice(first, timeout=5), client.wait_for_voice(second, timeout=5)
    assert (one.replaced, two.replaced) == (False, True)
    current = VoiceRegistry(client.connection).load("alice").summary
    assert current.transcript == "Two." and not current.replaced
    assert uploads(settings, "alice") == [current.source_uri]  # the replaced one is gone

    assert main(["voices", "add", "alice", str(tiny_model_dir / "prompt.wav"), "--no-wait"]) == 0
    capsys.readouterr()
    run_cosyq_burst(settings)
    third = VoiceRegistry(client.connection).load("alice").summary
    assert uploads(settings, "alice") == [third.source_uri] != [current.source_uri]
    client.remove_voice("alice")
    assert uploads(settings, "alice") == []  # rm deletes the recording too


def test_cli_says_replaced(
    settings: Settings, tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import threading  # noqa: PLC0415

    prompt = str(tiny_model_dir / "prompt.wav")
    connection = redis.Redis.from_url(settings.redis_url)
    queue = Queue(keys.QUEUE_HIGH, connection=connection, serializer=JSONSerializer)
    argv = ["voices", "add", "frank", prompt, "--timeout", "60"]
    for expected in ("added voice frank", "replaced voice frank"):
        codes: list[int] = []
        cli = threading.Thread(target=lambda out=codes: out.append(main(argv)))
        cli.start()
        deadline = time.monotonic() + 30
        while queue.count == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        run_cosyq_burst(settings)  # the worker, in this (main) thread
        cli.join(60)
        assert codes == [0]
        assert expected in capsys.readouterr().out


def test_a_refused_recording_is_not_kept(client: CosyqClient, settings: Settings) -> None:
    t = np.arange(24000) / 24000
    job_id = client.add_voice("gina", wav_bytes(0.3 * np.sin(2 * np.pi * 200 * t), 24000))
    [uri] = uploads(settings, "gina")
    Path(uri.removeprefix("file://")).write_bytes(wav_bytes(np.zeros(24000), 24000))
    run_cosyq_burst(settings)
    with pytest.raises(JobFailedError, match="silent"):
        client.wait_for_voice(job_id, timeout=5)
    assert uploads(settings, "gina") == []


def test_voices_are_per_tenant_old_ones_stay_defaults_and_the_cli_shares(
    settings: Settings,
    prompt_bytes: bytes,
    tiny_model_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("COSYQ_TENANTS", "alpha")
    settings = load_settings(env_file=None)
    queues = tenants.queue_names(settings.tenant_names())
    wav = str(tiny_model_dir / "prompt.wav")
    with CosyqClient(settings) as default, CosyqClient(settings, tenant="alpha") as alpha:
        default.add_voice("old", prompt_bytes, "Old.")
        shared = ["voices", "add", "narrator", wav, "--text", "Narrated.", "--shared", "--no-wait"]
        assert main(shared) == 0
        run_cosyq_burst(settings, queues)
        # as stored before tenants: the keys were already these; the upload at voices/<name>/
        profile = VoiceRegistry(default.connection).load("old")
        moved = Path(str(profile.summary.source_uri).removeprefix("file://"))
        legacy = moved.parent.parent.parent / "old" / moved.name
        legacy.parent.mkdir()
        moved.rename(legacy)
        summary = dataclasses.replace(profile.summary, source_uri=legacy.as_uri())
        VoiceRegistry(default.connection).save(dataclasses.replace(profile, summary=summary))
        assert [(v.name, v.shared) for v in alpha.list_voices()] == [("narrator", True)]
        assert [v.name for v in default.list_voices()] == ["old", "narrator"]
        with pytest.raises(UnknownVoiceError, match=r"no voice named 'old' .* tenant alpha"):
            alpha.submit({"text": "Hello there.", "voice": "old"})  # default's, not alpha's
        jobs = [
            default.submit({"text": "Hello there.", "voice": "old"}),
            alpha.submit({"text": "Hello there.", "voice": "narrator"}),
        ]
        run_cosyq_burst(settings, queues)
        assert [alpha.status(job_id).state for job_id in jobs] == ["finished", "finished"]

        capsys.readouterr()
        assert main(["voices", "list"]) == 0 and "narrator (shared)" in capsys.readouterr().out
        assert main(["voices", "rm", "narrator"]) == 1  # "default" has no voice of that name
        assert "no voice named 'narrator'" in capsys.readouterr().err
        assert main(["voices", "rm", "narrator", "--shared"]) == 0 and alpha.list_voices() == []
        assert uploads(settings, "narrator", owner="_shared") == []
        default.remove_voice("old")
        assert not legacy.exists()  # its upload from before tenants goes with it


def test_uploads_queued_together_never_pass_max_voices_at_the_worker(
    settings: Settings, prompt_bytes: bytes
) -> None:
    """Both uploads pass the producer's count (nothing stored yet); the worker counts again
    as it stores, in the same transaction: one voice is kept, the other job fails naming the
    quota and its recording is deleted."""
    limited = settings.model_copy(update={"tenant_max_voices": 1})
    with CosyqClient(limited) as client:
        jobs = {name: client.add_voice(name, prompt_bytes, "Hi.") for name in ("hal", "ida")}
        run_cosyq_burst(limited)
        outcomes = {}
        for name, job_id in jobs.items():
            try:
                outcomes[name] = client.wait_for_voice(job_id, timeout=5).name
            except JobFailedError as e:
                assert "quota max_voices 1" in str(e)
                outcomes[name] = "refused"
        kept = [v.name for v in client.list_voices()]
    assert sorted(outcomes.values()) == sorted([*kept, "refused"]) and len(kept) == 1
    [refused] = [name for name, outcome in outcomes.items() if outcome == "refused"]
    assert uploads(settings, refused) == [] and len(uploads(settings, kept[0])) == 1
    # both jobs settled their uploads: no note waits a grace for the sweep (it held the
    # tenant's voice names an hour after nothing needed them)
    assert client.connection.zcard(keys.VOICE_UPLOADS) == 0


def test_housekeeping_keeps_a_recording_its_job_or_its_voice_needs(
    client: CosyqClient, settings: Settings, prompt_bytes: bytes
) -> None:
    """The sweep of voice recordings a killed front left (shared/voice_uploads.py) never takes
    one whose add-voice job still waits, nor one its voice names (a crash leaves an orphan:
    tests/integration/producer/http/test_front_crash.py)."""
    sweep = VoiceUploadSweep(
        client.connection, settings, holder="test", storage=open_storage(settings)
    )
    due = time.time() + settings.voice_upload_grace_s + 1
    job_id = client.add_voice("alice", prompt_bytes, "One.", filename="a.wav")
    assert sweep.sweep(due) == [] and len(uploads(settings, "alice")) == 1  # its job waits
    run_cosyq_burst(settings)
    summary = client.wait_for_voice(job_id, timeout=5)
    assert client.connection.zcard(keys.VOICE_UPLOADS) == 0  # its job settled the note
    note = VoiceUpload(tenants.DEFAULT_TENANT, "alice", summary.source_uri, job_id)
    client.connection.zadd(keys.VOICE_UPLOADS, {note.member(): 0})  # as if settling was lost
    assert sweep.sweep(due + settings.voice_upload_grace_s + 1) == []
    assert uploads(settings, "alice") == [summary.source_uri]  # its voice names it
    assert client.connection.zcard(keys.VOICE_UPLOADS) == 0  # nothing left to look at
