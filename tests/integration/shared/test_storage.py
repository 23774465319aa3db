"""Storage on disk and on S3 (moto's server over real HTTP): keys, atomic writes, metadata."""

from __future__ import annotations

import io
import logging
import os
import re
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import boto3
import numpy as np
import pytest

from shared.audio import decode_audio, encode_audio
from shared.errors import (
    InvalidRequestError,
    ObjectNotFoundError,
    StorageError,
    StorageUnavailableError,
    TransientError,
)
from shared.logs import configure_logging
from shared.settings import Settings, load_settings
from shared.storage import (
    FileStorage,
    S3Storage,
    audio_metadata,
    object_key,
    open_storage,
)
from tests.integration.conftest import S3Endpoint

WHEN = datetime(2025, 3, 7, 23, 30, tzinfo=UTC)


def file_settings(root: Path, **overrides: object) -> Settings:
    return load_settings(env_file=None, storage_url=root.as_uri(), **overrides)


def s3_settings(endpoint: S3Endpoint, url: str, **overrides: object) -> Settings:
    return load_settings(
        env_file=None,
        storage_url=url,
        s3_endpoint_url=endpoint.url,
        s3_region=endpoint.region,
        s3_access_key_id=endpoint.access_key_id,
        s3_secret_access_key=endpoint.secret_access_key,
        **overrides,
    )


def make_bucket(endpoint: S3Endpoint, name: str) -> object:
    client = boto3.client(
        "s3",
        endpoint_url=endpoint.url,
        region_name=endpoint.region,
        aws_access_key_id=endpoint.access_key_id,
        aws_secret_access_key=endpoint.secret_access_key,
    )
    client.create_bucket(Bucket=name)
    return client


# ---- keys


def test_default_key_is_dated_by_utc_day() -> None:
    assert object_key("abc123", "wav", now=WHEN) == "2025/03/07/abc123.wav"
    later_elsewhere = WHEN.astimezone(timezone(timedelta(hours=5)))  # 2025-03-08 04:30 +05
    assert object_key("abc123", "wav", now=later_elsewhere) == "2025/03/07/abc123.wav"


def test_output_key_is_used_with_extension_added_once() -> None:
    assert object_key("j", "flac", "customers/42/hello") == "customers/42/hello.flac"
    assert object_key("j", "flac", "customers/42/hello.flac") == "customers/42/hello.flac"


@pytest.mark.parametrize("key", ["../x", "/abs", "a//b", "a\\b", "a/./b", "a/"])
def test_escaping_output_keys_are_refused(key: str) -> None:
    with pytest.raises(ValueError):
        object_key("j", "wav", key)


def test_odd_job_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="letters, digits"):
        object_key("../../etc", "wav")


# ---- disk


def test_file_put_get_round_trip(tmp_path: Path) -> None:
    storage = open_storage(file_settings(tmp_path / "out"))
    assert isinstance(storage, FileStorage)
    encoded = encode_audio(np.zeros(2400, np.float32), 24000, "wav")
    key = object_key("job1", "wav", now=WHEN)
    meta = audio_metadata(job_id="job1", sha256=encoded.sha256, duration_s=encoded.duration_s)
    stored = storage.put(key, encoded.data, encoded.content_type, meta)
    path = tmp_path / "out" / "2025" / "03" / "07" / "job1.wav"
    assert stored.uri == path.as_uri() and stored.bytes == len(encoded.data)
    assert path.read_bytes() == encoded.data
    assert storage.get(stored.uri) == encoded.data
    assert decode_audio(storage.get(stored.uri))[0].shape == (2400,)
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    # no temp file left; the audio's note beside it (shared/audio_notes.py)
    assert sorted(p.name for p in path.parent.iterdir()) == [".job1.wav.cosyq.json", "job1.wav"]


def test_file_put_replaces_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = open_storage(file_settings(tmp_path))
    storage.put("a/b.wav", b"old", "audio/wav", {})
    real_replace = os.replace

    def crash(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(StorageUnavailableError, match="No space left on device"):  # may pass
        storage.put("a/b.wav", b"new", "audio/wav", {})
    monkeypatch.setattr(os, "replace", real_replace)
    assert (tmp_path / "a" / "b.wav").read_bytes() == b"old"  # the reader never saw "new" half-made
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b.wav"]  # temp file removed


def test_file_put_removes_temp_files_a_killed_writer_left(tmp_path: Path) -> None:
    storage = open_storage(file_settings(tmp_path, job_timeout_s=600))
    folder = tmp_path / "a"
    folder.mkdir()
    host = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname().split(".")[0])
    killed = subprocess.Popen([sys.executable, "-c", "pass"])
    killed.wait()  # its pid is free now: the writer that left a temp file is dead
    names = {
        "dead here": f".b.wav.{host}-{killed.pid}.x1.tmp",
        "alive here": f".b.wav.{host}-1.x2.tmp",  # init: a live process
        "elsewhere, fresh": ".b.wav.otherhost-77.x3.tmp",
        "elsewhere, old": ".b.wav.otherhost-78.x4.tmp",
        "another key, old": f".other.wav.{host}-{killed.pid}.x5.tmp",
    }
    for name in names.values():
        (folder / name).write_bytes(b"half")
    hour_ago = time.time() - 3600
    for which in ("elsewhere, old", "another key, old"):
        os.utime(folder / names[which], (hour_ago, hour_ago))
    storage.put("a/b.wav", b"whole", "audio/wav", {})
    left = {p.name for p in folder.iterdir()}
    assert left == {
        "b.wav",
        names["alive here"],
        names["elsewhere, fresh"],
        names["another key, old"],  # only temps of the key being written are looked at
    }


@pytest.mark.parametrize("key", ["../escape.wav", "/etc/x.wav", "a//b.wav", "a\\b.wav"])
def test_file_put_refuses_escaping_keys(tmp_path: Path, key: str) -> None:
    storage = open_storage(file_settings(tmp_path / "root"))
    with pytest.raises(ValueError):
        storage.put(key, b"x", "audio/wav", {})
    assert not (tmp_path / "escape.wav").exists()


def test_file_put_refuses_symlink_escape(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    with pytest.raises(StorageError, match="resolves outside"):
        open_storage(file_settings(root)).put("link/x.wav", b"x", "audio/wav", {})
    assert not (outside / "x.wav").exists()


@pytest.mark.parametrize("key", ["link/made/here/x.wav", "inside/link/made/x.wav"])
def test_file_put_through_a_symlink_makes_no_folder_outside(tmp_path: Path, key: str) -> None:
    """The containment check comes before any mkdir (issue 44 item 9), for put and put_file."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "inside").mkdir(parents=True)
    outside.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    (root / "inside" / "link").symlink_to(outside, target_is_directory=True)
    source = tmp_path / "source.wav"
    source.write_bytes(b"x")
    storage = open_storage(file_settings(root))
    with pytest.raises(StorageError, match="resolves outside"):
        storage.put(key, b"x", "audio/wav", {})
    with pytest.raises(StorageError, match="resolves outside"):
        storage.put_file(key, source, "audio/wav", {})
    assert list(outside.iterdir()) == []
    storage.put("inside/deeper/x.wav", b"x", "audio/wav", {})  # real folders are still made
    assert (root / "inside" / "deeper" / "x.wav").read_bytes() == b"x"


def test_file_get_errors(tmp_path: Path) -> None:
    storage = open_storage(file_settings(tmp_path, max_read_bytes=10))
    with pytest.raises(ObjectNotFoundError, match="no such file"):
        storage.get((tmp_path / "missing.wav").as_uri())
    (tmp_path / "big.wav").write_bytes(b"x" * 11)
    with pytest.raises(InvalidRequestError, match="11 bytes, limit 10"):
        storage.get((tmp_path / "big.wav").as_uri())
    with pytest.raises(InvalidRequestError, match="only file:// and s3://"):
        storage.get("http://example.com/a.wav")


# ---- S3 over HTTP (moto server)


def test_s3_put_sets_content_type_and_metadata(s3_endpoint: S3Endpoint) -> None:
    client = make_bucket(s3_endpoint, "audio-out")
    storage = open_storage(s3_settings(s3_endpoint, "s3://audio-out/tts/v1"))
    assert isinstance(storage, S3Storage) and storage.base_uri == "s3://audio-out/tts/v1"
    encoded = encode_audio(np.zeros(4800, np.float32), 24000, "ogg", 16000)
    meta = audio_metadata(job_id="job9", sha256=encoded.sha256, duration_s=encoded.duration_s)
    stored = storage.put(object_key("job9", "ogg", now=WHEN), encoded.data, "audio/ogg", meta)
    assert stored.uri == "s3://audio-out/tts/v1/2025/03/07/job9.ogg"
    head = client.head_object(Bucket="audio-out", Key="tts/v1/2025/03/07/job9.ogg")  # type: ignore[attr-defined]
    assert head["ContentType"] == "audio/ogg"
    assert head["ContentLength"] == len(encoded.data)
    assert head["Metadata"] == {"job-id": "job9", "sha256": encoded.sha256, "duration-s": "0.200"}
    samples, rate = decode_audio(storage.get(stored.uri))
    assert rate == 16000 and samples.shape == (3200,)


def test_s3_credentials_from_the_aws_environment(
    s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_bucket(s3_endpoint, "env-creds")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "from-env")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    settings = load_settings(
        env_file=None, storage_url="s3://env-creds", s3_endpoint_url=s3_endpoint.url
    )
    storage = open_storage(settings)
    stored = storage.put("x.wav", b"RIFF", "audio/wav", {})
    assert stored.uri == "s3://env-creds/x.wav" and storage.get(stored.uri) == b"RIFF"


def test_s3_missing_object_and_bucket(s3_endpoint: S3Endpoint) -> None:
    make_bucket(s3_endpoint, "some-bucket")
    storage = open_storage(s3_settings(s3_endpoint, "s3://some-bucket/p"))
    with pytest.raises(ObjectNotFoundError, match=r"s3://some-bucket/nope.wav: not found"):
        storage.get("s3://some-bucket/nope.wav")
    with pytest.raises(ObjectNotFoundError, match="NoSuchBucket"):
        storage.get("s3://no-such-bucket/a.wav")  # a URI given to read: a bad request
    with pytest.raises(StorageError, match=r"no such bucket \(NoSuchBucket"):
        open_storage(s3_settings(s3_endpoint, "s3://no-such-bucket")).put("a.wav", b"x", "a", {})


def test_s3_refuses_escaping_keys_and_large_reads(s3_endpoint: S3Endpoint) -> None:
    make_bucket(s3_endpoint, "limits")
    storage = open_storage(s3_settings(s3_endpoint, "s3://limits/p", max_read_bytes=4))
    with pytest.raises(ValueError, match=r"'\.\.'"):
        storage.put("../outside.wav", b"x", "audio/wav", {})
    stored = storage.put("five.wav", b"12345", "audio/wav", {})
    with pytest.raises(InvalidRequestError, match="5 bytes, limit 4"):
        storage.get(stored.uri)


def test_s3_unreachable_endpoint_is_transient() -> None:
    settings = load_settings(
        env_file=None,
        storage_url="s3://b/p",
        s3_endpoint_url="http://127.0.0.1:9",  # discard port: nothing listens
        s3_region="us-east-1",
        s3_access_key_id="x",
        s3_secret_access_key="y",
    )
    with pytest.raises(TransientError, match=r"cannot write s3://b/p/a\.wav"):
        open_storage(settings).put("a.wav", b"x", "audio/wav", {})


def test_an_endpoint_url_with_credentials_is_never_in_an_error() -> None:
    """botocore quotes the endpoint URL it could not reach, userinfo and all."""
    settings = load_settings(
        env_file=None,
        storage_url="s3://b/p",
        s3_endpoint_url="http://minio:endpoint-pass-4K@127.0.0.1:9",  # nothing listens
        s3_region="us-east-1",
        s3_access_key_id="x",
        s3_secret_access_key="y",
    )
    storage = open_storage(settings)
    with pytest.raises(TransientError) as caught:
        storage.put("a.wav", b"x", "audio/wav", {})
    assert "127.0.0.1:9" in str(caught.value) and "endpoint-pass-4K" not in str(caught.value)
    with pytest.raises(TransientError) as caught:
        storage.get("s3://b/p/a.wav")
    assert "minio:***@" in str(caught.value) and "endpoint-pass-4K" not in str(caught.value)


def test_a_debug_log_of_s3_calls_shows_no_key_id_or_session_token(
    s3_endpoint: S3Endpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore at DEBUG prints each request's headers: Authorization names the key id, and
    X-Amz-Security-Token is the session token itself."""
    make_bucket(s3_endpoint, "debug-log")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIA-DEBUG-ID-6N")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "debug-secret-6N")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "debug-session-token-6N")
    settings = load_settings(
        env_file=None,
        storage_url="s3://debug-log",
        s3_endpoint_url=s3_endpoint.url,
        s3_region="us-east-1",
        log_level="DEBUG",
        log_format="json",
    )
    stream = io.StringIO()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure_logging(settings, stream=stream)
    try:
        storage = open_storage(settings)
        storage.get(storage.put("x.wav", b"RIFF", "audio/wav", {}).uri)
        logging.getLogger("cosyq.test").debug("still at DEBUG")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    assert "still at DEBUG" in stream.getvalue()
    assert "-6N" not in stream.getvalue(), stream.getvalue()
