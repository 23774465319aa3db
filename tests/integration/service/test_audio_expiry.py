"""A job's audio goes once its result has expired (workers/service/audio_expiry.py), on disk
(the file and its note) and on S3 (moto's server over real HTTP), with a real Redis: the audio
stayed for ever before, nothing deleted it. Only what is still the job's own goes: an
`output_key` a later job of the tenant wrote over stays for that job's own expiry; a job still
in Redis keeps its audio; a record naming another tenant's file deletes nothing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from rq.job import Job

from shared import keys
from shared.settings import Settings
from shared.storage import Storage, audio_metadata, open_storage
from tests.integration.conftest import S3Endpoint
from tests.integration.shared.test_storage import file_settings, make_bucket, s3_settings
from workers.service.audio_expiry import ExpiredAudio, remember_audio

MakeSettings = Callable[..., Settings]


@pytest.fixture(params=["file", "s3"])
def settings_for(request: pytest.FixtureRequest, tmp_path: Path) -> MakeSettings:
    if request.param == "file":
        return lambda **extra: file_settings(tmp_path / "out", **extra)
    endpoint: S3Endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"expiry-{tmp_path.name.lower().replace('_', '-')[-40:]}"
    make_bucket(endpoint, bucket)
    return lambda **extra: s3_settings(endpoint, f"s3://{bucket}/tts", **extra)


def _store(storage: Storage, key: str, job_id: str) -> None:
    metadata = audio_metadata(job_id=job_id, sha256="0" * 64, duration_s=1.0)
    storage.put(key, f"audio of {job_id}".encode(), "audio/wav", metadata)


def _due_now(connection: redis.Redis, *job_ids: str) -> None:
    connection.zadd(keys.AUDIO_DUE, dict.fromkeys(job_ids, 0), xx=True)


def _exists(storage: Storage, key: str) -> bool:
    return storage.job_of(key) is not None


def test_expired_jobs_audio_is_deleted_and_nothing_else(
    settings_for: MakeSettings, redis_url: str
) -> None:
    settings = settings_for(redis_url=redis_url, audio_retention="with_result")
    connection = redis.Redis.from_url(redis_url)
    storage = open_storage(settings)
    plain, reused = "tenants/alpha/2026/12/07/job-a.wav", "tenants/alpha/take.wav"
    _store(storage, plain, "job-a")  # expired: goes
    _store(storage, reused, "job-b")  # expired, but job-c wrote over it since: stays ...
    _store(storage, reused, "job-c")  # ... until job-c expires
    _store(storage, "tenants/beta/2026/12/07/job-d.wav", "job-d")  # still in Redis: stays
    stranger = "tenants/beta/secret.wav"  # beta's, named by a record of alpha's job: stays
    _store(storage, stranger, "job-e")
    for job_id, key, tenant in [
        ("job-a", plain, "alpha"),
        ("job-b", reused, "alpha"),
        ("job-d", "tenants/beta/2026/12/07/job-d.wav", "beta"),
        ("job-e", stranger, "alpha"),
    ]:
        remember_audio(connection, settings, job_id, key, tenant, named=key == reused)
    connection.hset(Job.key_for("job-d"), "status", "finished")
    connection.expire(Job.key_for("job-d"), 3600)
    _due_now(connection, "job-a", "job-b", "job-d", "job-e")
    duty = ExpiredAudio(connection, settings, holder="w1", storage=storage)
    assert sorted(duty.tick()) == ["job-a"]
    assert not _exists(storage, plain)
    assert storage.job_of(reused) == "job-c" and _exists(storage, stranger)
    assert _exists(storage, "tenants/beta/2026/12/07/job-d.wav")
    assert connection.zrange(keys.AUDIO_DUE, 0, -1) == [b"job-d"]  # looked at again later
    assert connection.zscore(keys.AUDIO_DUE, "job-d") > 3000  # at the job's own expiry
    remember_audio(connection, settings, "job-c", reused, "alpha", named=True)
    _due_now(connection, "job-c")
    connection.delete(keys.AUDIO_EXPIRY_LOCK)  # the next tick
    assert duty.tick() == ["job-c"]
    assert not _exists(storage, reused)
    if settings.storage_url.startswith("file:"):
        left = sorted(p.name for p in Path(settings.storage_url[7:]).rglob("*") if p.is_file())
        kept = [".job-d.wav.cosyq.json", ".secret.wav.cosyq.json", "job-d.wav", "secret.wav"]
        assert left == kept  # each deleted file's note went with it


@pytest.mark.parametrize(
    ("retention", "named", "recorded"),
    [
        ("keep", False, False),
        ("keep", True, False),
        ("unnamed", False, True),
        ("unnamed", True, False),  # the default: a caller's output_key is its own to delete
        ("with_result", True, True),
    ],
)
def test_what_audio_retention_records(
    settings_for: MakeSettings, redis_url: str, retention: str, named: bool, recorded: bool
) -> None:
    settings = settings_for(redis_url=redis_url, audio_retention=retention)
    connection = redis.Redis.from_url(redis_url)
    remember_audio(connection, settings, "job-a", "tenants/alpha/a.wav", "alpha", named=named)
    assert connection.exists(keys.AUDIO_RECORDS, keys.AUDIO_DUE) == (2 if recorded else 0)
