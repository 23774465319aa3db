"""The storage probe and write retries on real folders and moto's S3 server over HTTP.

Permanent faults (a file in the way, a read-only folder, no such bucket, wrong keys) get a
`permanent` verdict naming the cause; an S3 server that is down for a moment is `transient` and
waited out; a failed write leaves no object and no temp file behind.
"""

from __future__ import annotations

import errno
import json
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from shared.errors import StorageError, StorageUnavailableError
from shared.settings import Settings, load_settings
from shared.storage import file_error, open_storage
from shared.storage_probe import (
    Verdict,
    masked_url,
    probe_configured_storage,
    probe_storage,
    wait_for_storage,
)
from shared.storage_retry import Backoff, put_with_retries
from tests.doubles.harness import REPO_ROOT
from tests.doubles.s3_servers import AuthS3, RestartableS3, s3_client

NOBODY = 65534
NO_WAIT = Backoff(first_s=0.0, max_s=0.0)


def everything_in(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def s3_settings(url: str, storage_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "s3_endpoint_url": url,
        "s3_region": "us-east-1",
        "s3_access_key_id": "testing",
        "s3_secret_access_key": "testing",
        "s3_max_attempts": 1,  # these tests count our retries, not botocore's
        **overrides,
    }
    return load_settings(env_file=None, storage_url=storage_url, **values)


# ---- files


def test_a_good_folder_probes_ok_and_keeps_nothing(tmp_path: Path) -> None:
    root = tmp_path / "out"
    outcome = probe_configured_storage(load_settings(env_file=None, storage_url=root.as_uri()))
    assert outcome.verdict is Verdict.OK and outcome.ok and outcome.cause == ""
    assert outcome.line == f"storage {root.as_uri()}: ok"
    assert everything_in(root) == []  # made, written, read back, deleted


def test_a_file_url_under_a_regular_file_is_permanent(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("in the way")
    url = (tmp_path / "afile" / "sub").as_uri()
    storage = open_storage(load_settings(env_file=None, storage_url=url))
    for mode in ("write", "read"):
        outcome = probe_storage(storage, mode=mode)  # type: ignore[arg-type]
        assert outcome.verdict is Verdict.PERMANENT
        assert "Not a directory" in outcome.cause
        assert outcome.line.startswith(f"storage {url} is not usable (permanent): ")
        assert "\n" not in outcome.line
    assert everything_in(tmp_path) == ["afile"]


def test_a_read_only_folder_is_permanent_for_a_non_root_user(tmp_path: Path) -> None:
    """Root ignores file modes, so the probe runs in a child that drops to `nobody` first."""
    root = tmp_path / "readonly"
    root.mkdir()
    root.chmod(0o555)
    tmp_path.chmod(0o755)
    script = f"""
import json, os
from shared.settings import load_settings
from shared.storage import open_storage
from shared.storage_probe import probe_storage
storage = open_storage(load_settings(env_file=None, storage_url={root.as_uri()!r}))
if os.geteuid() == 0:
    os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})
print(json.dumps({{"uid": os.geteuid(), **probe_storage(storage).as_dict()}}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    outcome = json.loads(done.stdout)
    assert outcome["uid"] != 0
    assert outcome["verdict"] == "permanent"
    assert "Permission denied" in outcome["cause"] and str(root) in outcome["cause"]
    assert everything_in(root) == []


def test_a_write_that_fails_midway_leaves_no_temp_file(tmp_path: Path) -> None:
    """A file-size limit (RLIMIT_FSIZE) stops the write after 100 bytes: EFBIG, mid-write."""
    root = tmp_path / "out"
    script = f"""
from shared.settings import load_settings
from shared.storage import open_storage
from shared.errors import StorageError
storage = open_storage(load_settings(env_file=None, storage_url={root.as_uri()!r}))
try:
    storage.put("a/b.wav", b"x" * 10000, "audio/wav", {{}})
except StorageError as e:
    print("refused:", e)
"""

    def limit_file_size() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of being killed
        resource.setrlimit(resource.RLIMIT_FSIZE, (100, 100))

    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=limit_file_size,
    )
    assert done.stdout.startswith("refused: cannot write ") and "File too large" in done.stdout
    assert everything_in(root) == ["a"]  # the folder, no partial file, no .tmp


def test_a_replace_onto_a_folder_leaves_no_temp_file(tmp_path: Path) -> None:
    root = tmp_path / "out"
    (root / "taken.wav").mkdir(parents=True)
    storage = open_storage(load_settings(env_file=None, storage_url=root.as_uri()))
    with pytest.raises(StorageError, match="Is a directory"):
        storage.put("taken.wav", b"RIFF", "audio/wav", {})
    assert everything_in(root) == ["taken.wav"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_full_disk_is_transient_and_a_missing_folder_is_not() -> None:
    # /dev/full answers every write with ENOSPC
    with pytest.raises(OSError) as full, open("/dev/full", "wb", buffering=0) as device:
        device.write(b"x")
    assert full.value.errno == errno.ENOSPC
    assert isinstance(file_error(full.value, "cannot write x"), StorageUnavailableError)
    with pytest.raises(OSError) as missing:
        Path("/nonexistent/cosyq").mkdir()
    error = file_error(missing.value, "cannot write y")
    assert isinstance(error, StorageError) and "No such file or directory" in str(error)


# ---- S3


def test_s3_ok_probe_leaves_the_bucket_as_it_was(restartable_s3: RestartableS3) -> None:
    client = s3_client(restartable_s3.url)
    client.create_bucket(Bucket="probe-ok")
    storage = open_storage(s3_settings(restartable_s3.url, "s3://probe-ok/tts"))
    assert probe_storage(storage).ok and probe_storage(storage, mode="read").ok
    assert client.list_objects_v2(Bucket="probe-ok").get("KeyCount") == 0


def test_s3_missing_bucket_is_permanent(restartable_s3: RestartableS3) -> None:
    storage = open_storage(s3_settings(restartable_s3.url, "s3://no-such-bucket-here/p"))
    outcome = probe_storage(storage)
    assert outcome.verdict is Verdict.PERMANENT
    assert "no such bucket (NoSuchBucket, HTTP 404)" in outcome.cause
    assert outcome.url == "s3://no-such-bucket-here/p"
    assert probe_storage(storage, mode="read").verdict is Verdict.PERMANENT
    with pytest.raises(StorageError, match="no such bucket"):  # a write: not "not found"
        storage.put("a.wav", b"x", "audio/wav", {})


def test_s3_wrong_credentials_are_permanent(auth_s3: AuthS3) -> None:
    good = s3_settings(
        auth_s3.url,
        "s3://checked/p",
        s3_access_key_id=auth_s3.key_id,
        s3_secret_access_key=auth_s3.secret,
    )
    assert probe_storage(open_storage(good)).ok  # the same server, the right keys
    for key_id, secret, said in (
        (auth_s3.key_id, "not-the-secret", "the secret key does not match"),
        ("AKIAUNKNOWN0000000", auth_s3.secret, "the access key id is not known"),
    ):
        settings = s3_settings(
            auth_s3.url, "s3://checked/p", s3_access_key_id=key_id, s3_secret_access_key=secret
        )
        outcome = probe_storage(open_storage(settings))
        assert outcome.verdict is Verdict.PERMANENT
        assert said in outcome.cause and "HTTP 403" in outcome.cause
        assert secret not in outcome.line
    listing = s3_client(auth_s3.url, auth_s3.key_id, auth_s3.secret).list_objects_v2(
        Bucket="checked"
    )
    assert listing.get("KeyCount") == 0


def test_s3_down_is_transient_and_waited_out(restartable_s3: RestartableS3) -> None:
    s3_client(restartable_s3.url).create_bucket(Bucket="probe-wait")
    storage = open_storage(s3_settings(restartable_s3.url, "s3://probe-wait"))
    restartable_s3.stop()
    down = probe_storage(storage)
    assert down.verdict is Verdict.TRANSIENT and "cannot write s3://probe-wait/" in down.cause
    retries: list[float] = []

    def back_up_after_two(outcome: object, delay_s: float) -> None:
        retries.append(delay_s)
        if len(retries) == 2:
            restartable_s3.start()

    outcome = wait_for_storage(
        storage, wait_s=30, backoff=Backoff(0.05, 0.1), on_retry=back_up_after_two
    )
    assert outcome.ok and outcome.attempts == 3 and retries == [0.05, 0.1]


def test_s3_down_for_longer_than_the_wait_gives_up(restartable_s3: RestartableS3) -> None:
    s3_client(restartable_s3.url).create_bucket(Bucket="probe-give-up")
    storage = open_storage(s3_settings(restartable_s3.url, "s3://probe-give-up"))
    assert probe_storage(storage).ok  # the client is made (slow on a busy machine) while up
    restartable_s3.stop()
    outcome = wait_for_storage(storage, wait_s=1.0, backoff=Backoff(0.1, 0.2))
    assert outcome.verdict is Verdict.TRANSIENT and outcome.attempts >= 2
    assert "still failing after" in outcome.cause and outcome.elapsed_s < 10


def test_a_write_is_retried_through_an_outage(restartable_s3: RestartableS3) -> None:
    client = s3_client(restartable_s3.url)
    client.create_bucket(Bucket="retry-write")
    storage = open_storage(s3_settings(restartable_s3.url, "s3://retry-write/p"))
    restartable_s3.stop()
    pauses: list[float] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 2:
            restartable_s3.start()

    stored = put_with_retries(
        storage, "a.wav", b"RIFF", "audio/wav", {}, attempts=4, backoff=Backoff(1, 2), sleep=pause
    )
    assert pauses == [1, 2] and stored.uri == "s3://retry-write/p/a.wav"
    assert client.get_object(Bucket="retry-write", Key="p/a.wav")["Body"].read() == b"RIFF"
    restartable_s3.stop()
    with pytest.raises(StorageUnavailableError):  # attempts used up: the job's retries take over
        put_with_retries(
            storage, "b.wav", b"x", "audio/wav", {}, attempts=2, backoff=NO_WAIT, sleep=pause
        )
    assert len(pauses) == 3


def test_a_permanent_write_error_is_not_retried(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("in the way")
    storage = open_storage(load_settings(env_file=None, storage_url=(tmp_path / "afile").as_uri()))
    pauses: list[float] = []
    with pytest.raises(StorageError, match="a file is in the way"):
        put_with_retries(
            storage,
            "a.wav",
            b"x",
            "audio/wav",
            {},
            attempts=5,
            backoff=NO_WAIT,
            sleep=pauses.append,
        )
    assert pauses == []


def test_masked_url_hides_passwords_and_queries() -> None:
    shown = masked_url("s3://key:hunter2@bucket/p?X-Amz-Signature=abc#frag")
    assert shown == "s3://key:***@bucket/p"
    assert masked_url("file:///srv/out") == "file:///srv/out"
